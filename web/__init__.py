"""MechSandbox's pages: the playground (``/web``), the run viewer (``/web/runs``, ``mechsandbox report --html``).

Why hand-written HTML and two small scripts instead of OpenEnv's Gradio interface or a UI framework: the pages need
a form, a text area, tables and a heatmap, which plain HTML does; the playground must play by the server's own
episode rules (its ``/reset`` and ``/step``, sessions, limits, tokens), which Gradio's ``/web/reset`` (one shared,
stateless environment) does not; and nothing here should need a build step, a CDN or a download at run time. The
server sends every page with a Content-Security-Policy that allows only its own scripts, and every text that comes
from a snippet, a run folder or a model is inserted as text (``html.escape`` here, ``textContent`` in the scripts),
never as markup.
"""
