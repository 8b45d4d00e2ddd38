"""``mechsandbox eval``: run an agent over many episodes against a server and write a report."""
