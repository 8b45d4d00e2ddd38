"""The guest side of the sandbox: what runs in the zygote and its workers, behind the jail (docs/SANDBOX.md).

Everything here treats the snippet as an adversary and may be reached by one that escaped layers 1-2: the zygote and
the worker loop, the worker's own namespaces, hardening (rlimits, Landlock, seccomp, the uid drop), the language
policy and the module facades, the runtime and the answer conversion. It imports only the shared modules of
``mechsandbox.server.sandbox`` (settings, frames, payload, sealed, code_paths) and never the host side; the jail shows
the guest exactly this folder and those modules (``code_paths.GUEST_CODE``)."""
