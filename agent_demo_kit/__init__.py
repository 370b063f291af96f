"""agent-demo's parts besides the loop (agent_demo.py), the tools (tools.py) and the prompts
(prompts.py): one module per concern. Importing the package imports nothing else, so
`agent-demo --version` starts fast."""

__version__ = "0.3.0"
