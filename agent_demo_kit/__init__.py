"""agent-demo's parts besides the loop (agent_demo.py), the tools (tools.py) and the prompts
(prompts.py): one module per layer. Importing the package imports nothing else, so
`agent-demo --version` starts fast.

tools.py and prompts.py are `agent_demo_kit.tools` and `agent_demo_kit.prompts`: an install puts
them in this package (no module called `tools` or `prompts` is installed, so a folder's own
tools.py neither shadows them nor is shadowed); in a checkout they sit beside agent_demo.py, where
they are read first, and the package looks there for them (docs/design.md, "Installed names")."""
import os

__version__ = "0.8.0"

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.exists(os.path.join(__path__[0], "tools.py")):  # a checkout (or an editable install) of it
    __path__.append(_CHECKOUT)
