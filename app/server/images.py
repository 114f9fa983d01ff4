"""Images as requests carry them (base64, data: URIs, http(s) URLs), decoded to pixels with Pillow:
PNG, JPEG, WebP and GIF (its first frame). Everything that can be wrong with one is a 4xx that names
its part: not an image, an unsupported format, too large in bytes or in pixels, a URL not allowed."""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass

import httpx
from PIL import Image, UnidentifiedImageError

from app.llama.media import Picture
from app.server.errors import ApiError

FORMATS = {"PNG", "JPEG", "WEBP", "GIF"}
URL_SECONDS = 10.0


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int
    max_pixels: int
    allow_urls: bool = False


@dataclass(frozen=True)
class ImageIn:
    """An image part as sent, read only once the model is known to see: base64 (or a data: URI) or a
    URL, and where it was in the request."""

    where: str
    source: str  # "base64" or "url"
    value: object


def from_base64(value: object, where: str) -> ImageIn:
    """Base64 (Anthropic's, Ollama's, llama-server's), or a data: URI."""
    return ImageIn(where, "base64", value)


def from_url(value: object, where: str) -> ImageIn:
    """OpenAI's image_url / Responses' image_url: a data: URI, or http(s) where allowed."""
    return ImageIn(where, "url", value)


def _bad(where: str, what: str, code: str = "invalid_image") -> ApiError:
    return ApiError(400, f"{where}: {what}", param=where, code=code)


def _base64_bytes(text: object, where: str, limits: ImageLimits) -> bytes:
    if not isinstance(text, str) or not text:
        raise _bad(where, "an image must be base64 text")
    if text.startswith("data:"):
        head, _, text = text.partition(",")
        if not head.endswith(";base64"):
            raise _bad(where, "a data: URI image must be base64 (data:image/png;base64,...)")
    if len(text) * 3 // 4 > limits.max_bytes:
        raise too_large(where, len(text) * 3 // 4, limits)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(where, "the image is not valid base64") from None


def too_large(where: str, size: int, limits: ImageLimits) -> ApiError:
    return ApiError(413, f"{where}: the image is {size:,} bytes; this server takes images up to {limits.max_bytes:,} "
                         "bytes (--max-image-bytes)", param=where, code="image_too_large")


async def read(img: ImageIn, limits: ImageLimits) -> bytes:
    """The image's bytes: base64 decoded, or a URL fetched within the size and time limits (where
    the server fetches URLs at all)."""
    url = img.value
    if img.source == "base64" or (isinstance(url, str) and url.startswith("data:")):
        return _base64_bytes(url, img.where, limits)
    if not isinstance(url, str) or not url:
        raise _bad(img.where, "image_url needs a url")
    if not url.startswith(("http://", "https://")):
        raise _bad(img.where, "an image URL must be a data: URI or http(s)")
    if not limits.allow_urls:
        raise _bad(img.where, "this server does not fetch image URLs: send the image as a data: URI (base64), or "
                              "start the server with --allow-image-urls", "image_url_not_allowed")
    return await _fetch(url, img.where, limits)


async def _fetch(url: str, where: str, limits: ImageLimits) -> bytes:
    data = bytearray()
    try:
        async with httpx.AsyncClient(timeout=URL_SECONDS, follow_redirects=True) as client:
            async with client.stream("GET", url) as r:
                if r.status_code != 200:
                    raise _bad(where, f"fetching the image gave HTTP {r.status_code}", "image_fetch_failed")
                async for chunk in r.aiter_bytes():
                    data += chunk
                    if len(data) > limits.max_bytes:
                        raise too_large(where, len(data), limits)
    except httpx.HTTPError as e:
        raise _bad(where, f"the image could not be fetched ({type(e).__name__})", "image_fetch_failed") from None
    return bytes(data)


def decode(data: bytes, where: str, limits: ImageLimits) -> Picture:
    """The image's RGB pixels (a GIF's first frame; transparency over white)."""
    if len(data) > limits.max_bytes:
        raise too_large(where, len(data), limits)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            if im.format not in FORMATS:
                raise ApiError(415, f"{where}: {im.format} images are not taken (PNG, JPEG, WebP, GIF)", param=where,
                               code="unsupported_image")
            w, h = im.size
            if w * h > limits.max_pixels:
                raise ApiError(413, f"{where}: the image is {w}x{h} pixels; this server takes up to "
                                    f"{limits.max_pixels:,} pixels (--max-image-pixels)", param=where,
                               code="image_too_large")
            im.seek(0)
            rgb = _rgb(im)
    except ApiError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as e:
        raise _bad(where, "not an image" if isinstance(e, UnidentifiedImageError)
                   else f"a damaged image ({type(e).__name__})") from None
    return Picture(rgb.width, rgb.height, rgb.tobytes())


def _rgb(im: Image.Image) -> Image.Image:
    if im.mode in ("RGBA", "LA", "P", "PA"):
        im = im.convert("RGBA")
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, im).convert("RGB")
    return im.convert("RGB")
