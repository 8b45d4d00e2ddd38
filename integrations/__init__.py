"""Adapters to other ecosystems' harnesses (issue 18): each module imports its harness, which the base install lacks.

``inspect_task`` needs the ``[inspect]`` extra (``pip install 'mechsandbox[inspect]'``).
"""
