"""The model-facing form of a tool's parameter schema.

Clients (ListTools, GetCapabilities, the HTTP listing, the MCP server face) get a tool's full JSON
Schema. A model gets it flat and small, in the subset every provider takes: Gemini's function
declarations refuse `$ref`/`$defs`, `additionalProperties`, `const`, `format` values and other
keywords outside an OpenAPI 3.0 subset, and one refused keyword fails the whole request; OpenAI
(not strict) and Anthropic take that subset as it is. So references are inlined, `allOf` merged,
`oneOf` read as `anyOf`, a null alternative dropped (leaving the parameter out means null), a
`const` becomes a one-value `enum`, and only the keywords below are kept. The tool still validates
every call against its full schema.
"""

from __future__ import annotations

from typing import Any

_KEPT = frozenset(
    {
        "type", "description", "properties", "required", "items", "enum", "default",
        "minimum", "maximum", "minLength", "maxLength", "pattern", "minItems", "maxItems",
    }
)  # fmt: skip
_MAX_REF_DEPTH = 8
"""References followed within one another: a recursive schema ends there, in a schema allowing anything."""
_MAX_NODES = 5000
"""Schema nodes made before references stop being inlined: a schema from an MCP server or a client
whose references fan out (each naming several that name several...) must not grow without bound."""


def model_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (a tool's parameters) flattened for a model; always an object schema."""
    flat = _Flattener(schema).flat(schema, 0)
    flat.pop("type", None)
    return {"type": "object", "properties": {}, **flat}


class _Flattener:
    def __init__(self, root: dict[str, Any]) -> None:
        self._root = root
        self._nodes = 0

    def flat(self, node: Any, depth: int) -> dict[str, Any]:
        self._nodes += 1
        if not isinstance(node, dict):
            return {}  # a boolean schema, or something that is no schema: anything goes
        ref = node.get("$ref")
        if isinstance(ref, str):
            inline = depth < _MAX_REF_DEPTH and self._nodes < _MAX_NODES
            target = _resolve(self._root, ref) if inline else None
            out = self.flat(target, depth + 1) if target is not None else {}
            _merge(out, self.flat({k: v for k, v in node.items() if k != "$ref"}, depth))
            return out
        out = {}
        for part in _listed(node.get("allOf")):
            _merge(out, self.flat(part, depth))
        alternatives = [
            self.flat(part, depth) for part in _listed(node.get("anyOf")) + _listed(node.get("oneOf"))
        ]
        alternatives = [part for part in alternatives if part.get("type") != "null"]
        if len(alternatives) == 1:
            _merge(out, alternatives[0])
        elif alternatives:
            out["anyOf"] = alternatives
        _merge(out, self._own(node, depth))
        return out

    def _own(self, node: dict[str, Any], depth: int) -> dict[str, Any]:
        """The node's own keywords, in the kept subset."""
        own = {key: value for key, value in node.items() if key in _KEPT}
        if "const" in node:
            own["enum"] = [node["const"]]
        if isinstance(own.get("type"), list):  # ["string", "null"]: one type, or anyOf the types
            kinds = [kind for kind in own.pop("type") if kind != "null"]
            if len(kinds) == 1:
                own["type"] = kinds[0]
            elif kinds:
                own["anyOf"] = [{"type": kind} for kind in kinds]
        if "default" in own and own["default"] is None:
            del own["default"]
        if isinstance(own.get("properties"), dict):
            own["properties"] = {name: self.flat(value, depth) for name, value in own["properties"].items()}
        else:
            own.pop("properties", None)
        if "items" in own:
            own["items"] = self.flat(own["items"], depth)
        return own


def _merge(into: dict[str, Any], part: dict[str, Any]) -> None:
    """`part` into `into`: properties and required lists joined, any other keyword replaced."""
    for key, value in part.items():
        if key == "properties" and isinstance(into.get(key), dict):
            into[key] = {**into[key], **value}
        elif key == "required" and isinstance(into.get(key), list) and isinstance(value, list):
            into[key] = [*into[key], *(name for name in value if name not in into[key])]
        else:
            into[key] = value


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _resolve(root: dict[str, Any], ref: str) -> Any:
    """The node a local JSON pointer (`#/$defs/Item`) names; None when it names none."""
    if ref != "#" and not ref.startswith("#/"):
        return None
    node: Any = root
    for token in ref[2:].split("/") if ref != "#" else ():
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or token not in node:
            return None
        node = node[token]
    return node
