"""The host side of the sandbox: what runs in the server process (docs/SANDBOX.md).

The pool, its workers' handles and the watchdog (``pool``), the jail's command line and cgroups (``jail``,
``memory``), and the folder of guest code the jail shows (``guest_tree``). It talks to the guest only through the
frame format (``..frames``) and the sealed model file (``..sealed``, ``..payload``); nothing here runs snippet code,
and none of it is inside the jail."""
