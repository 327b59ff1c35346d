"""Chat templates, rendered in a sandbox: jinja2's immutable sandbox, in a worker
thread with a deadline (:data:`TEMPLATE_DEADLINE_S`) and a bound on every string a
template builds and on its output (:data:`TEMPLATE_MAX_CHARS`).

:func:`compile_template` compiles a template's source; :func:`render_bounded` renders
it with the model's variables, raising :class:`TemplateTimeout` at the deadline and
:class:`~sf_trt.tokenizer.base.TokenizerError` for anything else that goes wrong.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from .base import TokenizerError

__all__ = ["TEMPLATE_DEADLINE_S", "TEMPLATE_MAX_CHARS", "TemplateTimeout", "compile_template", "render_bounded"]

TEMPLATE_DEADLINE_S = 2.0
"""Seconds a chat template may take to render (SmolLM2's takes well under a millisecond)."""
TEMPLATE_MAX_CHARS = 8 << 20
"""The longest string a chat template may build or output, in characters."""


class TemplateTimeout(BaseException):
    """Raised inside the render thread at its deadline (BaseException: the template cannot catch it)."""


class _TemplateTooLarge(Exception):
    pass


def _check_size(n: int) -> None:
    if n > TEMPLATE_MAX_CHARS:
        raise _TemplateTooLarge(f"chat template: builds a value of {n} items, more than {TEMPLATE_MAX_CHARS}")


def _bounded(value: Any) -> Any:
    if isinstance(value, (str, list, tuple, bytes)):
        _check_size(len(value))
    return value


def compile_template(source: str):
    try:
        from jinja2.compiler import CodeGenerator
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise TokenizerError("apply_chat_template needs jinja2 (pip install jinja2)") from None
    import jinja2

    class BoundedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node, frame):  # ``a ~ b``: through bounded_join
            self.write("environment.bounded_join((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """The immutable sandbox, with every ``+ * ** ~`` and call result bounded."""

        code_generator_class = BoundedCodeGenerator
        intercepted_binops = frozenset(["+", "*", "**", "%"])

        def bounded_join(self, parts):
            return _bounded("".join(str(p) for p in parts))

        def call_binop(self, context, operator, left, right):
            if operator == "*" and isinstance(right, int) and isinstance(left, (str, list, tuple)):
                _check_size(len(left) * right)
            if operator == "*" and isinstance(left, int) and isinstance(right, (str, list, tuple)):
                _check_size(len(right) * left)
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1024:
                raise _TemplateTooLarge(f"chat template: exponent {right} is too large")
            return _bounded(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's own spelling)
            return _bounded(super().call(__context, __obj, *args, **kwargs))

    def raise_exception(message: str):
        raise TokenizerError(f"chat template: {message}")

    def strftime_now(fmt: str) -> str:
        import datetime

        return datetime.datetime.now().strftime(fmt)

    def tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False, ensure_ascii: bool = False) -> str:
        import json

        return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)

    # what transformers' apply_chat_template gives a template: loop controls ({% break %},
    # {% continue %}), raise_exception, strftime_now, and a tojson that leaves text unescaped
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.filters["tojson"] = tojson
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise TokenizerError(f"chat template: does not compile ({type(exc).__name__}: {exc})") from None


def render_bounded(template, kwargs: dict[str, Any]) -> str:
    """``template`` rendered in a worker thread: :class:`TemplateTimeout` after
    :data:`TEMPLATE_DEADLINE_S` (the thread is stopped), TokenizerError for an
    error or a result over :data:`TEMPLATE_MAX_CHARS`."""
    import jinja2

    box: dict[str, Any] = {}

    def work() -> None:
        try:
            out, size = [], 0
            for chunk in template.generate(**kwargs):
                size += len(chunk)
                if size > TEMPLATE_MAX_CHARS:
                    raise _TemplateTooLarge(f"chat template: output exceeds {TEMPLATE_MAX_CHARS} characters")
                out.append(chunk)
            box["text"] = "".join(out)
        except TemplateTimeout:
            pass
        except (TokenizerError, _TemplateTooLarge) as exc:
            box["error"] = str(exc)
        except Exception as exc:  # the template is untrusted code: whatever it raises is its failure
            kind = "" if isinstance(exc, jinja2.TemplateError) else f"{type(exc).__name__}: "
            box["error"] = f"chat template: failed to render ({kind}{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"

    worker = threading.Thread(target=work, name="sf_trt-chat-template", daemon=True)
    worker.start()
    worker.join(TEMPLATE_DEADLINE_S)
    if worker.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(TemplateTimeout))
        worker.join(0.5)
        raise TemplateTimeout()
    if "error" in box:
        raise TokenizerError(box["error"])
    return box["text"]
