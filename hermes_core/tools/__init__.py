"""The tool registry, populated with every built-in tool in the order of SPEC §3.1.

The universe of tool names is static: importing this package registers every built-in tool,
whatever optional packages are installed, so the dataset schema is the same on every machine.
"""

from hermes_core.tools.registry import Tool, ToolContext, ToolError, registry, result_failed, tool
from hermes_core.tools import terminal, files, code, networked, memory, todo  # noqa: F401  (registration)

TOOLSET_ORDER = ["terminal", "file", "code_execution", "web", "vision", "image_gen", "browser", "memory", "todo"]

__all__ = ["Tool", "ToolContext", "ToolError", "registry", "result_failed", "tool", "TOOLSET_ORDER"]
