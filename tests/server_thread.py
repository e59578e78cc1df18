"""A live server (uvicorn, real sockets) in a thread of the test process, and
a tiny GGUF whose chat template renders tools the way Qwen2.5's does."""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import httpx
from server_helpers import free_port

#: A chat template in the manner of Qwen2.5's (ChatML; tools listed in the
#: system turn as JSON; calls as <tool_call> blocks; results as
#: <tool_response> in a user turn), written for these tests.
TOOLS_TEMPLATE = """{%- if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}


# Tools

You may call functions. Their signatures are within <tools></tools>:
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools>
Return each call as <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{% for message in messages %}
{% if message.role == 'system' %}
{% elif message.role == 'assistant' %}
<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{% for call in message.tool_calls or [] %}

<tool_call>
{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}
</tool_call>
{% endfor %}
<|im_end|>
{% elif message.role == 'tool' %}
<|im_start|>user
<tool_response name="{{ message.name }}" id="{{ message.tool_call_id }}">
{{ message.content }}
</tool_response><|im_end|>
{% else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""


def render_independently(template: str, messages: list, tools: Optional[list] = None, **extra: Any) -> str:
    """``template`` rendered by plain jinja2 with transformers' conventions
    (trim/lstrip blocks, a ``tojson`` that keeps non-ASCII, arguments as
    objects): the prompt a server must produce, computed without its code."""
    import json

    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    shaped = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.loads(c["function"]["arguments"])))
                               for c in m["tool_calls"]]
        shaped.append(m)
    return env.from_string(template).render(messages=shaped, tools=tools, add_generation_prompt=True,
                                            bos_token="", eos_token="", **extra)


def write_tools_model(path, tags: bool = False) -> str:
    """The tiny target's weights and vocabulary with :data:`TOOLS_TEMPLATE`;
    with ``tags``, ``<tool_call>`` and ``</tool_call>`` are tokens of their own, as in Qwen2.5."""
    from tiny_gguf import write_tiny_model

    if not path.exists():
        write_tiny_model(path, n_vocab=384, seed=0, n_layer=2, chat_template=TOOLS_TEMPLATE,
                         user_tokens=("<tool_call>", "</tool_call>") if tags else ())
    return str(path)


class ThreadServer:
    """``create_app(load, options)`` served by uvicorn on a free port until
    :meth:`stop` (the decoder is closed by the app's shutdown)."""

    def __init__(self, load: Any, options: Any, *, timeout: float = 120.0, **app_kwargs: Any) -> None:
        import uvicorn

        from specdec_cpu.server.openai_app import create_app

        self.app = create_app(load, options, **app_kwargs)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="test-server", daemon=True)
        self.thread.start()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if not self.thread.is_alive():
                raise AssertionError("the server thread ended")
            time.sleep(0.05)
        raise AssertionError(f"server not ready after {timeout} s")

    def post(self, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=kwargs.pop("timeout", 60), **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)

    def __enter__(self) -> "ThreadServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
