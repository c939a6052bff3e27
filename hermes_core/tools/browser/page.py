"""One sample's tab: its own browser context (isolated cookies and storage), navigation, and text
snapshots of the accessibility tree in which interactive elements carry refs (`@e3`) for click and
type. All methods block; they run on the Chromium connection's loop. Every connection of the tab's
context goes through its own `GuardProxy`, and a tool result lists the requests it refused."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hermes_core.tools.browser.chromium import BrowserError, Chromium
from hermes_core.tools.browser.guard import BYPASS_LIST, GuardProxy, Resolver

LOAD_TIMEOUT_S = 30.0
NAVIGATION_GRACE_S = 0.3  # after a click or key press: long enough to see a navigation start
INTERACTIVE = {"link", "button", "textbox", "searchbox", "checkbox", "radio", "combobox", "listbox", "option",
               "menuitem", "tab", "switch", "slider", "spinbutton"}
SKIPPED = {"none", "generic", "InlineTextBox", "LineBreak", "presentation"}
BLOCKED_NOTE = ("The browser refused these connections (private, loopback or link-local addresses are not "
                "reachable); nothing was loaded from them.")
# Draws "[N]" over an element (this) in the viewport; false when the element is not displayed.
LABEL_FUNCTION = """function(label) {
  if (!this.getBoundingClientRect) return false;
  const box = this.getBoundingClientRect();
  if (!box.width && !box.height) return false;
  const tag = document.createElement('div');
  tag.setAttribute('data-hermes-label', '');
  tag.textContent = label;
  tag.style.cssText = 'position:fixed;z-index:2147483647;pointer-events:none;background:#ffd400;color:#000;'
    + 'font:bold 12px monospace;padding:0 2px;border:1px solid #000;left:' + Math.max(0, box.left) + 'px;top:'
    + Math.max(0, box.top) + 'px';
  document.documentElement.appendChild(tag);
  return true;
}"""
REMOVE_LABELS = "document.querySelectorAll('[data-hermes-label]').forEach(tag => tag.remove())"
KEYS = {"Enter": 13, "Tab": 9, "Escape": 27, "Backspace": 8, "ArrowDown": 40, "ArrowUp": 38, "ArrowLeft": 37,
        "ArrowRight": 39, "PageDown": 34, "PageUp": 33, "Home": 36, "End": 35, "Space": 32}


class Page:
    """`Page.open(browser, resolve, max_chars)` makes the context and tab; `close()` disposes of both."""

    def __init__(self, browser: Chromium, guard: GuardProxy, context_id: str, session: str, max_chars: int) -> None:
        self.browser, self.guard, self.context_id, self.session = browser, guard, context_id, session
        self.max_chars = max_chars
        self.refs: dict[str, int] = {}  # "@e3" -> backend DOM node id, from the latest snapshot
        self.console: list[str] = []
        self._loaded = asyncio.Event()
        self._navigating = asyncio.Event()
        browser.listen(session, self._on_event)

    @classmethod
    def open(cls, browser: Chromium, resolve: Resolver, max_chars: int = 8000) -> "Page":
        """A new tab in a new browser context whose connections `resolve` must allow (see guard.py)."""
        async def create() -> Page:
            guard = GuardProxy(resolve)
            try:
                context = (await browser.send("Target.createBrowserContext", {
                    "disposeOnDetach": True, "proxyServer": await guard.start(),
                    "proxyBypassList": BYPASS_LIST}))["browserContextId"]
                target = (await browser.send("Target.createTarget", {"url": "about:blank",
                                                                    "browserContextId": context}))["targetId"]
                session = (await browser.send("Target.attachToTarget",
                                              {"targetId": target, "flatten": True}))["sessionId"]
            except BaseException:
                await guard.close()
                raise
            page = cls(browser, guard, context, session, max_chars)
            for domain in ("Page", "Runtime", "Accessibility", "DOM"):
                await browser.send(f"{domain}.enable", session=session)
            return page

        return browser.run(create())

    def _on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            self._loaded.set()
        elif method in ("Page.frameStartedLoading", "Page.frameRequestedNavigation"):
            self._navigating.set()
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", []))
            self.console.append(f"{params.get('type', 'log')}: {text}"[:500])
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails") or {}
            self.console.append(f"error: {(details.get('exception') or {}).get('description') or details.get('text')}"[:500])

    async def _send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, self.session)

    async def _wait_for_load(self) -> None:
        try:
            await asyncio.wait_for(self._loaded.wait(), LOAD_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise BrowserError(f"the page did not finish loading within {LOAD_TIMEOUT_S:.0f} s") from None

    async def _after_action(self) -> None:
        """If the action started a navigation, wait for the new page to load."""
        try:
            await asyncio.wait_for(self._navigating.wait(), NAVIGATION_GRACE_S)
        except asyncio.TimeoutError:
            return
        await self._wait_for_load()

    def _act(self, action: Any) -> dict[str, Any]:
        """Run `action` (a coroutine function), then return a fresh snapshot."""
        async def run() -> dict[str, Any]:
            self._loaded.clear()
            self._navigating.clear()
            await action()
            return await self._snapshot()

        return self.browser.run(run())

    # -- actions ----------------------------------------------------------------------------------
    def navigate(self, url: str) -> dict[str, Any]:
        async def go() -> None:
            reply = await self._send("Page.navigate", {"url": url})
            if reply.get("errorText"):
                blocked = "".join(f"; blocked: {entry}" for entry in self.guard.take_blocked())
                raise BrowserError(f"{url}: {reply['errorText']}{blocked}")
            await self._wait_for_load()

        return self._act(go)

    def snapshot(self, full: bool = False) -> dict[str, Any]:
        """The compact snapshot, or with `full` also the structural elements it leaves out."""
        return self.browser.run(self._snapshot(full))

    def evaluate(self, expression: str) -> dict[str, Any]:
        """The value of a JavaScript expression in the page, as JSON (a JSON string is parsed),
        awaited when it is a promise; a thrown exception is a BrowserError."""
        reply = self.browser.run(self._send("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True, "userGesture": True}))
        if reply.get("exceptionDetails"):
            details = reply["exceptionDetails"]
            raise BrowserError(f"the expression threw: {(details.get('exception') or {}).get('description') or details.get('text')}")
        result = reply.get("result") or {}
        value = result.get("value", result.get("unserializableValue", result.get("description")))
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                pass  # a plain string
        text = json.dumps(value, ensure_ascii=False, default=str)
        if len(text) > self.max_chars:  # bounded like every other page text
            return {"result": text[:self.max_chars], "result_type": "str", "truncated": True}
        return {"result": value, "result_type": type(value).__name__}

    def click(self, ref: str) -> dict[str, Any]:
        async def click() -> None:
            await self._call_on(ref, "function(){this.scrollIntoView({block:'center'}); this.click();}")
            await self._after_action()

        return self._act(click)

    def type(self, ref: str, text: str) -> dict[str, Any]:
        async def type_text() -> None:
            await self._call_on(ref, "function(){this.focus(); if ('value' in this) this.value='';}")
            await self._send("Input.insertText", {"text": text})

        return self._act(type_text)

    def press(self, key: str) -> dict[str, Any]:
        if key not in KEYS and len(key) != 1:
            raise BrowserError(f"unknown key {key!r}; known: {', '.join(KEYS)} or one character")

        async def press() -> None:
            code = KEYS[key] if key in KEYS else ord(key.upper())
            text = {"Enter": "\r", "Space": " "}.get(key, key if len(key) == 1 else "")
            for kind in ("keyDown", "keyUp"):
                await self._send("Input.dispatchKeyEvent", {"type": kind, "key": key, "windowsVirtualKeyCode": code,
                                                            **({"text": text} if kind == "keyDown" and text else {})})
            await self._after_action()

        return self._act(press)

    def scroll(self, direction: str) -> dict[str, Any]:
        sign = -1 if direction == "up" else 1

        async def scroll() -> None:
            await self._send("Runtime.evaluate", {"expression": f"window.scrollBy(0, {sign} * window.innerHeight)"})

        return self._act(scroll)

    def back(self) -> dict[str, Any]:
        async def back() -> None:
            history = await self._send("Page.getNavigationHistory")
            if history["currentIndex"] < 1:
                raise BrowserError("there is no previous page")
            entry = history["entries"][history["currentIndex"] - 1]
            await self._send("Page.navigateToHistoryEntry", {"entryId": entry["id"]})
            await self._wait_for_load()

        return self._act(back)

    def images(self) -> list[dict[str, str]]:
        script = "JSON.stringify([...document.images].map(i => ({src: i.currentSrc || i.src, alt: i.alt})))"
        reply = self.browser.run(self._send("Runtime.evaluate", {"expression": script, "returnByValue": True}))
        return json.loads(reply["result"]["value"])[:100]

    def screenshot(self, annotate: bool = False) -> tuple[str, list[dict[str, str]]]:
        """A PNG of the viewport, as a data URL, and the labels drawn on it: with `annotate`, each
        visible element of a fresh snapshot carries "[N]" for its ref "@eN" (removed afterwards)."""
        async def shoot() -> tuple[str, list[dict[str, str]]]:
            labels: list[dict[str, str]] = []
            if annotate:
                await self._snapshot()
                for ref, node in self.refs.items():
                    try:
                        target = (await self._send("DOM.resolveNode", {"backendNodeId": node}))["object"]["objectId"]
                        drawn = await self._send("Runtime.callFunctionOn", {
                            "objectId": target, "functionDeclaration": LABEL_FUNCTION, "returnByValue": True,
                            "arguments": [{"value": f"[{ref[2:]}]"}]})
                    except BrowserError:
                        continue  # gone since the snapshot: nothing to label
                    if (drawn.get("result") or {}).get("value"):
                        labels.append({"label": f"[{ref[2:]}]", "ref": ref})
            try:
                data = (await self._send("Page.captureScreenshot", {"format": "png"}))["data"]
            finally:
                if annotate:
                    await self._send("Runtime.evaluate", {"expression": REMOVE_LABELS})
            return f"data:image/png;base64,{data}", labels

        return self.browser.run(shoot())

    def close(self) -> None:
        self.browser.forget(self.session)

        async def dispose() -> None:
            try:
                await self.browser.send("Target.disposeBrowserContext", {"browserContextId": self.context_id})
            finally:
                await self.guard.close()

        try:
            self.browser.run(dispose())
        except BrowserError:
            pass  # the browser is gone already: nothing of this sample is left in it

    # -- internals --------------------------------------------------------------------------------
    async def _call_on(self, ref: str, function: str) -> None:
        node = self.refs.get(ref if ref.startswith("@") else f"@{ref}")
        if node is None:
            raise BrowserError(f"no element {ref!r} in the latest snapshot; take a new snapshot")
        try:
            target = (await self._send("DOM.resolveNode", {"backendNodeId": node}))["object"]["objectId"]
        except BrowserError:
            raise BrowserError(f"element {ref} is gone from the page; take a new snapshot") from None
        await self._send("Runtime.callFunctionOn", {"objectId": target, "functionDeclaration": function})

    async def _snapshot(self, full: bool = False) -> dict[str, Any]:
        tree = (await self._send("Accessibility.getFullAXTree"))["nodes"]
        info = (await self._send("Runtime.evaluate", {"expression": "JSON.stringify([location.href, document.title])",
                                                      "returnByValue": True}))["result"]["value"]
        url, title = json.loads(info)
        self.refs, lines = {}, []
        children = {node["nodeId"]: node.get("childIds", []) for node in tree}
        nodes = {node["nodeId"]: node for node in tree}

        def walk(node_id: str, depth: int, parent_name: str) -> None:
            node = nodes.get(node_id)
            if node is None:
                return
            role = (node.get("role") or {}).get("value", "")
            name = str((node.get("name") or {}).get("value", "")).strip()
            repeated = role == "StaticText" and name == parent_name  # a link's or heading's own text
            if full:  # structural elements too, nameless ones included; InlineTextBox only repeats its text
                shown = not node.get("ignored") and role != "InlineTextBox" and not repeated
            else:
                shown = not node.get("ignored") and role not in SKIPPED and (name or role in INTERACTIVE) and not repeated
            if shown and not (role in ("StaticText", "RootWebArea") and not name):
                line = f"{'  ' * depth}- {role}" + (f' "{name[:200]}"' if name and role != "StaticText" else "")
                if role == "StaticText":
                    line = f"{'  ' * depth}- text: {name[:300]}"
                if role in INTERACTIVE and node.get("backendDOMNodeId"):
                    ref = f"@e{len(self.refs) + 1}"
                    self.refs[ref] = node["backendDOMNodeId"]
                    line += f" [{ref}]"
                lines.append(line)
            for child in children.get(node_id, []):
                walk(child, depth + 1 if shown else depth, name if shown else parent_name)

        if tree:
            walk(tree[0]["nodeId"], 0, "")
        text = "\n".join(lines)
        blocked = self.guard.take_blocked()
        return {"url": url, "title": title, "snapshot": text[:self.max_chars], "truncated": len(text) > self.max_chars,
                "untrusted_content": True, **({"blocked": blocked, "blocked_note": BLOCKED_NOTE} if blocked else {})}
