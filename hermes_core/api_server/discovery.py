"""What the API server says about itself: `/v1/capabilities` and `/v1/toolsets`, in the shapes the
original Hermes Agent's API server uses (same keys), stating only what this server really does.
Also: recognising a chat frontend's housekeeping requests, answered without tools.
"""

from __future__ import annotations

from typing import Any

from hermes_core.agent.loop import resolve_toolsets
from hermes_core.tools import registry as default_registry
from hermes_core.api_server.sessions import SESSION_ID_HEADER, SESSION_KEY_HEADER
from hermes_core.api_server.settings import ApiServerSettings
from hermes_core.tools.backends import ToolBackends

# Every feature flag of the original's document; True only where this server implements it.
SUPPORTED_FEATURES = {"chat_completions", "chat_completions_streaming", "tool_progress_events"}
FEATURE_FLAGS = (
    "chat_completions", "chat_completions_streaming", "responses_api", "responses_streaming", "run_submission",
    "run_status", "run_events_sse", "run_stop", "run_approval_response", "tool_progress_events", "approval_events",
    "session_resources", "session_chat", "session_chat_streaming", "session_fork", "admin_config_rw", "jobs_admin",
    "memory_write_api", "skills_api", "audio_api", "realtime_voice",
)
# The original's endpoint directory, limited to the endpoints served here.
ENDPOINTS = {
    "health": {"method": "GET", "path": "/health"},
    "models": {"method": "GET", "path": "/v1/models"},
    "chat_completions": {"method": "POST", "path": "/v1/chat/completions"},
    "toolsets": {"method": "GET", "path": "/v1/toolsets"},
}
# Labels and descriptions in this project's own words.
TOOLSET_TEXT = {
    "terminal": ("Terminal", "Shell commands and background processes in the sandbox"),
    "file": ("Files", "Read, write, patch and search files in the sandbox"),
    "code_execution": ("Code execution", "Run Python programs that can call the other tools"),
    "web": ("Web", "Search the web and extract page content"),
    "vision": ("Vision", "Answer questions about images"),
    "image_gen": ("Image generation", "Create images from a text prompt"),
    "browser": ("Browser", "Drive a headless browser: navigate, read, click, type"),
    "memory": ("Memory", "Notes about the user and the task that persist across turns"),
    "todo": ("Todo list", "Plan and track the steps of a task"),
}
# Open WebUI (0.12.x) sends its title, tags, follow-up, search query, image prompt and autocomplete tasks
# as one user message built from a template that starts with this heading and embeds the chat in a
# <chat_history> block. Its RAG template starts with the same heading but wraps a real question (with
# the documents in <context>): that one is answered by the agent.
HOUSEKEEPING_PREFIX = "### Task:"
HOUSEKEEPING_MARKER = "<chat_history>"


def capabilities(settings: ApiServerSettings) -> dict[str, Any]:
    """The `/v1/capabilities` document."""
    features: dict[str, Any] = {name: name in SUPPORTED_FEATURES for name in FEATURE_FLAGS}
    features.update(session_continuity_header=SESSION_ID_HEADER, session_key_header=SESSION_KEY_HEADER,
                    cors=bool(settings.cors_origins))
    return {
        "object": "hermes.api_server.capabilities",
        "platform": "hermes-agent",
        "model": settings.model_name,
        "auth": {"type": "bearer", "required": True},  # the server refuses to start without a key
        "runtime": {
            "mode": "server_agent",
            "tool_execution": "server",
            "split_runtime": False,
            "description": "Each request runs a Hermes agent on the server; its tools execute in a sandbox there "
                           f"(one per request, or one per {SESSION_ID_HEADER} session).",
        },
        "features": features,
        "endpoints": ENDPOINTS,
    }


def toolsets(settings: ApiServerSettings) -> dict[str, Any]:
    """The `/v1/toolsets` document: every toolset, whether this server offers it (`enabled`), whether
    its tools can run here (`configured`: backends and keys present) and its tools."""
    backends = ToolBackends.resolve()
    offered = set(resolve_toolsets(list(settings.toolsets) if settings.toolsets else None, None))
    data = []
    for name, tools in default_registry.toolsets.items():
        label, description = TOOLSET_TEXT.get(name, (name, ""))
        data.append({"name": name, "label": label, "description": description, "enabled": name in offered,
                     "configured": bool(default_registry.available([name], backends)), "tools": sorted(set(tools))})
    return {"object": "list", "platform": "api_server", "data": data}


def is_housekeeping(user_message: str, history: list[dict[str, Any]]) -> bool:
    """A frontend's housekeeping task (title, tags, follow-ups, ...): a single-message request whose
    text starts with Open WebUI's task heading and quotes the chat. It needs a model answer, not an
    agent with tools."""
    text = user_message.lstrip()
    return not history and text.startswith(HOUSEKEEPING_PREFIX) and HOUSEKEEPING_MARKER in text
