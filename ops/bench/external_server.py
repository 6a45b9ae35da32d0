"""`arbor bench serving --base-url`: an OpenAI-compatible server someone else started.

Only what the client needs before the sweep: a plain-HTTP base URL (the client speaks HTTP/1.1
over asyncio streams, no TLS) and the model name to send, from --model or else the first id that
GET {base}/v1/models lists (vLLM and llama-server list the one they serve).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

PROBE_TIMEOUT_S = 10.0


class ServerError(ValueError):
    """The server at --base-url cannot be benchmarked; the message names the URL and why."""


def normalized_base_url(base_url: str) -> str:
    """`http://host:port`, from that or `http://host:port/` or `http://host:port/v1` (as OpenAI SDKs take it)."""
    url = urllib.parse.urlsplit(base_url.strip())
    path = url.path.rstrip("/").removesuffix("/v1")
    if url.scheme != "http" or not url.hostname or path or url.query:
        raise ServerError(f"--base-url={base_url!r} must be http://host[:port] (no TLS, no path but /v1)")
    return f"http://{url.netloc}"


def served_model(base_url: str, model: str | None, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """`model` once the server answers GET /v1/models, or the first id it lists there."""
    url = f"{base_url}/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            listing = json.loads(response.read())
    except urllib.error.HTTPError as error:
        if model:  # it answers; listing models is optional for a server
            return model
        raise ServerError(f"GET {url} answered HTTP {error.code}: pass --model") from None
    except (urllib.error.URLError, OSError) as error:
        raise ServerError(f"--base-url={base_url}: GET {url} failed ({_reason(error)})") from None
    except json.JSONDecodeError:
        raise ServerError(f"GET {url} did not answer JSON: is {base_url} an OpenAI-compatible server?") from None
    return model or _first_model_id(listing, url)


def _first_model_id(listing: object, url: str) -> str:
    data = listing.get("data") if isinstance(listing, dict) else None
    ids = [entry.get("id") for entry in data or [] if isinstance(entry, dict) and entry.get("id")]
    if not ids:
        raise ServerError(f"GET {url} lists no models: pass --model")
    return str(ids[0])


def _reason(error: Exception) -> str:
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    return str(reason) or type(reason).__name__
