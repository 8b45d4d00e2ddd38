"""Adapters to other ecosystems' harnesses (issues 18 and 19): each module imports its harness, which the base install
lacks.

``inspect_task`` needs the ``[inspect]`` extra (``pip install 'mechsandbox[inspect]'``); ``trl`` and ``tiny_chat``
need the ``[trl]`` extra. ``mcp_client`` (the JSON-RPC client of POST /mcp both use) needs only httpx.
"""
