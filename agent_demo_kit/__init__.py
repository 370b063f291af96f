"""agent-demo's parts besides the loop (agent_demo.py), the tools (tools.py) and the prompts
(prompts.py): one module per layer. Importing the package imports nothing else, so
`agent-demo --version` starts fast; it only makes sure prompts.py and tools.py are agent-demo's own."""
import importlib.util
import os

__version__ = "0.6.0"


def _check_not_shadowed(*names: str) -> None:
    """agent-demo's prompts.py and tools.py are installed beside this package; a folder's own file of
    that name, found first, would be imported instead and fail in ways that name neither."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in names:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        if origin and os.path.dirname(os.path.abspath(origin)) != here:
            raise ImportError(f"{origin} shadows agent-demo's own {name}.py: rename it, or run from another folder")


_check_not_shadowed("prompts", "tools")
