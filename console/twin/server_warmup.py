"""The twin server's warm-up request, as SGLang's `_wait_and_warmup` sends it before the server logs ready."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def warmup(host: str, port: int, *, multimodal: bool, served_model_name: str) -> None:
    """SGLang's own warm-up before it says it is ready: `/model_info`, then one short generation (a chat
    request with an image on a multimodal model), so the first request an operator sends is not the first."""
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    with urllib.request.urlopen(base + "/model_info", timeout=30) as resp:
        resp.read()
    if multimodal:
        path = "/v1/chat/completions"
        body: dict[str, Any] = {
            "model": served_model_name,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                        {"type": "text", "text": "Describe the image."},
                    ],
                }
            ],
            "max_tokens": 8,
            "temperature": 0,
        }
    else:
        path = "/generate"
        body = {
            "sampling_params": {"temperature": 0, "max_new_tokens": 8},
            "text": "The capital city of France is",
        }
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=600) as resp:
        resp.read()
