"""The planner's arithmetic against llama.cpp's own allocations, and the search on 27B stand-ins."""


import pytest

from app.build.info import cpu_buffers
from app.gguf.info import read_model_info
from app.gguf.synthetic import SHAPES, write_sparse
from app.llama.measure import measure
from app.plan import terms as M
from app.drafting.mtp import KIND as MTP
from app.plan.hardware import Gpu, Hardware
from app.plan.planner import PlanError, PlanRequest, make_plan

MTP_ROWS = MTP.rows
GiB = 1024**3
BUFFERS = cpu_buffers()
NO_GPU = Hardware(gpus=(), ram_total=24 * GiB, ram_available=20 * GiB, cpu_count=2)
# The real files' sizes (MODELS-27B.md): the stand-ins are sparse files of exactly this size.
TRUE_SIZES = {"qwen3.6-27b": 16_817_244_384, "qwen3.6-27b-mtp": 17_106_773_120, "qwen3.5-0.8b": 532_517_120,
              "gemma3-27b": 17_229_630_496, "gemma3-270m": 241_410_624}


def close(pred: int, got: int, tol: float) -> bool:
    return abs(pred - got) <= tol * got


CASES = [  # (n_ctx, n_ubatch, n_seq, type_k, type_v, flash_attn)
    (2000, 512, 1, "f16", "f16", True),
    (30000, 256, 2, "q8_0", "q8_0", True),
    (8192, 512, 1, "f16", "f16", False),
    (16384, 256, 4, "f16", "f16", False),  # a CPU plan's default now (flash attention off)
    (5000, 128, 3, "q4_0", "q4_0", True),
    (12000, 256, 1, "q8_0", "f16", True),
]


def _models(tiny, real_pair, gemma_270m):
    return {"tiny": tiny.target, "qwen-1.5b": real_pair.target, "qwen-0.5b": real_pair.draft, "gemma-270m": gemma_270m}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"ctx{c[0]}-ub{c[1]}-seq{c[2]}-{c[3]}-{c[4]}-fa{int(c[5])}")
def test_terms_match_llama_cpp_allocations(case, tiny, real_pair, gemma_270m):
    """Weights and KV within 3%, compute within 10%, of what llama.cpp allocates (CPU, unified KV)."""
    ctx, ub, seq, tk, tv, fa = case
    checked = 0
    for name, path in _models(tiny, real_pair, gemma_270m).items():
        info = read_model_info(path)
        if M.kv_incompatibility(info, tk, tv, fa, "cpu") or ctx > info.context_length:
            continue  # llama.cpp refuses these (tiny's 16-wide heads cannot hold q8_0 blocks)
        got = measure(path, ctx, tk, tv, n_ubatch=ub, n_seq_max=seq, flash_attn=fa)
        cs = M.context_shape(ctx, seq, tk, tv, n_ubatch=ub, flash_attn=fa)
        _, host = M.weight_placement(info, 0)
        assert host == M.data_bytes(info) and close(host, got.get("model", "CPU_Mapped"), 0.03), name
        assert close(M.mapped_report_bytes(info, BUFFERS), got.get("model", "CPU_Mapped"), 0.03), name
        extra = M.cpu_extra_bytes(info, 0, BUFFERS)  # the copies this build makes: AMX, CPU_REPACK or none
        for buf in M.CPU_EXTRA_BUFFERS:
            assert close(extra.get(buf, 0), got.get("model", buf), 0.03), (name, buf)
        assert close(M.kv_bytes(info, cs), got.total("KV"), 0.03), name
        assert close(M.compute_bytes(info, cs), got.total("compute"), 0.10), name
        if got.total("output") > 0.01 * M.MiB:
            assert close(M.output_bytes(info, cs), got.total("output"), 0.03), name
        checked += 1
    assert checked >= 3


@pytest.fixture(scope="session")
def standins(tmp_path_factory):
    d = tmp_path_factory.mktemp("standins")
    return {k: write_sparse(d / f"{k}.gguf", SHAPES[k], TRUE_SIZES[k]) for k in SHAPES}


@pytest.mark.parametrize("name, ctx, seq, rs", [("qwen3.6-27b", 110_000, 1, 8), ("qwen3.6-27b", 8192, 2, 4),
                                                ("qwen3.5-0.8b", 110_000, 2, 8), ("gemma3-27b", 110_000, 1, 0),
                                                ("gemma3-270m", 65_536, 4, 0)])
def test_standins_against_llama_cpp_dry_run(standins, name, ctx, seq, rs):
    """llama.cpp loads the 27B-shaped headers with no_alloc: recurrent state, output and compute agree."""
    path = standins[name]
    info = read_model_info(path)
    got = measure(path, ctx, "q8_0", "q8_0", n_seq_max=seq, n_rs_seq=rs, no_alloc=True)
    cs = M.context_shape(ctx, seq, "q8_0", "q8_0", n_rs_seq=rs)
    assert close(M.recurrent_state_bytes(info, cs), got.total("RS"), 0.03) or not info.n_recurrent_layers
    assert close(M.output_bytes(info, cs), got.total("output"), 0.03)
    assert close(M.compute_bytes(info, cs), got.total("compute"), 0.10)


def test_standins_have_the_published_shapes(standins):
    q = read_model_info(standins["qwen3.6-27b"])
    assert (q.n_layers, q.n_attention_layers, q.n_recurrent_layers, len(q.tensors)) == (64, 16, 48, 851)
    assert q.file_size == TRUE_SIZES["qwen3.6-27b"] and q.vocab.size == 248_320
    g = read_model_info(standins["gemma3-27b"])
    assert (g.n_layers, g.n_swa_layers, g.sliding_window) == (62, 52, 1024)
    assert abs(g.tensor_bytes - TRUE_SIZES["gemma3-27b"]) / TRUE_SIZES["gemma3-27b"] < 0.001


@pytest.fixture(scope="session")
def infos(standins):
    return {k: read_model_info(p) for k, p in standins.items()}


PAIRS = [("qwen3.6-27b", "qwen3.5-0.8b"), ("gemma3-27b", "gemma3-270m")]


@pytest.mark.parametrize("target, draft", PAIRS)
def test_27b_presets_fit_24gib_at_110k(infos, target, draft):
    req = PlanRequest(vram=24 * GiB, ctx=110_000, ctx_is_user_choice=True)
    plan = make_plan(infos[target], infos[draft], req, NO_GPU, 110_000)
    assert plan.fits and plan.ctx == 110_000 and plan.target.n_gpu_layers == infos[target].n_layers + 1
    assert plan.used <= plan.budget and plan.headroom >= 0
    names = {t.name for t in plan.terms}
    assert {"target weights", "draft weights", "target KV cache", "draft KV cache", "target compute buffer",
            "runtime reserve", "safety margin"} <= names
    margin = next(t.bytes for t in plan.terms if t.name == "safety margin")
    assert margin >= 256 * 1024**2
    assert plan.target.kv_unified and plan.draft.n_ctx == plan.target.n_ctx


@pytest.mark.parametrize("target, draft", PAIRS + [("qwen3.6-27b-mtp", "mtp")])
def test_27b_presets_with_their_projector_still_fit_24gib_at_110k(infos, tmp_path, target, draft):
    """The vision projectors (header stand-ins of their published shapes) cost ~1 GB: the presets'
    110K still fits, the plan choosing a q8_0 KV cache, and it says what an image costs there."""
    from app.gguf.projector import read_projector
    from app.gguf.synthetic import write_mmproj_header

    which = "gemma3-27b" if target.startswith("gemma") else "qwen3.6-27b"
    vision = read_projector(write_mmproj_header(tmp_path / "mmproj.gguf", which))
    req = PlanRequest(vram=24 * GiB)
    plan = make_plan(infos[target], None if draft == "mtp" else infos[draft], req, NO_GPU, 110_000, head=MTP_ROWS if draft == "mtp" else None,
                     projector=vision)
    assert plan.fits and plan.ctx == 110_000 and plan.used <= plan.budget
    rows = {t.name: t.bytes for t in plan.terms}
    assert rows["vision projector weights"] == vision.weights_bytes > 800 * 2**20
    assert rows["vision projector compute"] == vision.compute_bytes
    assert plan.vision.tokens_per_image == (256 if which == "gemma3-27b" else 576)
    assert plan.vision.images_per_request == 110_000 // plan.vision.tokens_per_image


def test_the_mtp_preset_fits_24gib_at_110k_and_counts_its_head(infos):
    """Qwen3.6-27B drafting with its own MTP head: the nextn block's weights, its context's cache and
    buffers, and the target's hidden states are counted, and no draft model; the same file planned
    without MTP leaves the nextn block's weights out (llama.cpp skips them)."""
    target = infos["qwen3.6-27b-mtp"]
    assert (target.n_layers, target.n_nextn, target.n_attention_layers, target.n_recurrent_layers) == (65, 1, 17, 48)
    req = PlanRequest(vram=24 * GiB, ctx=110_000, ctx_is_user_choice=True)
    plan = make_plan(target, None, req, NO_GPU, 110_000, head=MTP_ROWS)
    assert plan.fits and plan.ctx == 110_000 and plan.draft is None and plan.head is not None
    terms = {t.name: t.bytes for t in plan.terms}
    assert terms["MTP head weights"] == M.nextn_bytes(target) > 250 * 2**20  # measured layout: 264 MiB
    mtp_cs = M.context_shape(plan.ctx, plan.parallel, plan.target.type_k, plan.target.type_v)
    assert terms["MTP KV cache"] == M.kv_bytes(target, mtp_cs, nextn=True) > 0
    assert {"MTP compute buffer", "target hidden-state output buffer", "target compute (hidden-state output)"} <= set(terms)
    assert "target compute buffer" not in terms
    assert plan.head.n_ctx == plan.target.n_ctx and plan.head.n_rs_seq == 0
    plain = make_plan(target, None, PlanRequest(vram=24 * GiB, ctx=110_000, ctx_is_user_choice=True, draft_max=plan.draft_max),
                      NO_GPU, 110_000)
    plain_weights = next(t.bytes for t in plain.terms if t.name == "target weights")
    assert plain.head is None and terms["target weights"] == plain_weights
    assert abs(plain.used + terms["MTP head weights"] - plan.used) < plan.used * 0.1


def test_mtp_context_terms_match_llama_cpp(infos, standins, tmp_path):
    """The MTP head's cache and weights against what llama.cpp allocates (a small MTP-shaped model,
    real allocation), and the target's compute buffer after it decoded a full ubatch handing out
    every token's hidden state (llama.cpp grows the buffer then, past what it reserved)."""
    from app.gguf.synthetic import write_mtp_standin

    small = write_mtp_standin(tmp_path / "mtp.gguf", n_vocab=2048)
    info = read_model_info(small)
    for ctx, seq, ub, fa, cap in ((16384, 2, 512, True, 8), (8192, 2, 512, False, 0), (32768, 2, 256, True, 8)):
        got = measure(small, ctx, n_ubatch=ub, n_seq_max=seq, flash_attn=fa, n_rs_seq=3, mtp=True, n_outputs_max=cap, hidden=fa)
        cs = M.context_shape(ctx, seq, "f16", "f16", n_ubatch=ub, flash_attn=fa, n_rs_seq=3, n_outputs_max=cap)
        assert close(M.kv_bytes(info, cs, nextn=True), got.total("mtp KV"), 0.03)
        assert close(M.kv_bytes(info, cs), got.total("KV"), 0.03)
        assert close(M.data_bytes(info), got.get("model", "CPU_Mapped"), 0.03)
        if fa:  # the 27B plans' setting (CUDA)
            assert close(M.compute_bytes(info, cs, hidden=True), got.total("compute after a decode"), 0.10), ctx
    without = measure(small, 4096)
    assert close(M.data_bytes(info) - M.nextn_bytes(info), without.get("model", "CPU_Mapped"), 0.03)


@pytest.mark.parametrize("ctx", [110_000, 32_768])
def test_the_mtp_plan_s_buffers_match_llama_cpp_on_the_27b_standin(infos, standins, ctx):
    """Each of the MTP plan's buffers against llama.cpp's own dry run of the 27B stand-in with the
    plan's parameters: output rows capped as llama-server caps them (target: slots x (1 + draft
    length), head: one per slot), which shrinks both compute buffers' logits phase from a ubatch's
    248,320-wide rows to a few. The head's one-block graph is planned with the trunk's formula: an
    upper bound (llama.cpp reuses more of it), within 40 %."""
    target = infos["qwen3.6-27b-mtp"]
    req = PlanRequest(vram=24 * GiB, ctx=ctx, ctx_is_user_choice=True)
    plan = make_plan(target, None, req, NO_GPU, ctx, head=MTP_ROWS)
    t = plan.target
    assert t.n_outputs_max == plan.parallel * (1 + plan.draft_max) and plan.head.n_outputs_max == plan.parallel
    got = measure(standins["qwen3.6-27b-mtp"], t.n_ctx, t.type_k, t.type_v, n_ubatch=t.n_ubatch, n_seq_max=t.n_seq_max,
                  n_rs_seq=t.n_rs_seq, no_alloc=True, mtp=True, n_outputs_max=t.n_outputs_max)
    terms = {x.name: x.bytes for x in plan.terms}
    assert close(terms["target compute (hidden-state output)"], got.total("compute"), 0.10)
    assert close(terms["target recurrent state"], got.total("RS"), 0.03)
    assert got.total("mtp compute") <= terms["MTP compute buffer"] <= 1.4 * got.total("mtp compute")
    uncapped = measure(standins["qwen3.6-27b-mtp"], t.n_ctx, t.type_k, t.type_v, n_seq_max=t.n_seq_max,
                       n_rs_seq=t.n_rs_seq, no_alloc=True, mtp=True)
    assert uncapped.total("compute") - got.total("compute") > 200 * 2**20  # the cap is what saves it


def test_mtp_on_a_target_without_nextn_layers_is_one_line_naming_the_file(infos):
    with pytest.raises(PlanError, match=r"--draft mtp: qwen3.6-27b.gguf has no MTP \(nextn\) layers"):
        make_plan(infos["qwen3.6-27b"], None, PlanRequest(vram=24 * GiB), NO_GPU, 110_000, head=MTP_ROWS)


def test_hybrid_plan_reserves_rollback_snapshots(infos):
    plan = make_plan(infos["qwen3.6-27b"], infos["qwen3.5-0.8b"], PlanRequest(vram=24 * GiB), NO_GPU, 110_000)
    rs = next(t for t in plan.terms if t.name == "target recurrent state")
    assert plan.target.n_rs_seq == plan.draft_max > 0
    per_copy = 149.6 * 1024**2 * 1.0  # 48 layers: R 5.62 + S 144.00 MiB, as llama.cpp logs it
    assert abs(rs.bytes - per_copy * plan.parallel * (1 + plan.draft_max)) < 0.01 * rs.bytes


def test_never_a_plan_that_overflows(infos):
    """Over many budgets and contexts, a returned plan always fits; otherwise it is a clear error."""
    for vram_gib in (12, 18, 24, 48):  # a tight, a short, the target and a roomy card
        for ctx in (4096, 65536, 110_000, 131_072):
            for t, d in PAIRS:
                req = PlanRequest(vram=vram_gib * GiB, ctx=ctx, ctx_is_user_choice=True)
                try:
                    plan = make_plan(infos[t], infos[d], req, NO_GPU, ctx)
                except PlanError as e:
                    assert "nothing fits" in e.message or "trained length" in e.message
                    continue
                assert plan.used <= plan.budget, (vram_gib, ctx, t)


def test_budget_too_small_says_largest_context(infos):
    with pytest.raises(PlanError) as e:
        make_plan(infos["gemma3-27b"], infos["gemma3-270m"], PlanRequest(vram=20 * GiB, ctx=131_072, ctx_is_user_choice=True,
                  n_gpu_layers=63), NO_GPU, None)
    assert "largest context that fits is" in e.value.message and "GiB" in e.value.message
    with pytest.raises(PlanError, match="even the weights do not fit"):
        make_plan(infos["qwen3.6-27b"], None, PlanRequest(vram=8 * GiB, n_gpu_layers=65), NO_GPU, 4096)


def test_preset_context_shrinks_when_not_asked(infos):
    plan = make_plan(infos["gemma3-27b"], infos["gemma3-270m"], PlanRequest(vram=19 * GiB), NO_GPU, 110_000)
    assert plan.ctx < 110_000 and plan.ctx % 256 == 0 and any("aims for" in w for w in plan.warnings)


def test_user_context_kept_by_partial_offload(infos):
    plan = make_plan(infos["qwen3.6-27b"], infos["qwen3.5-0.8b"],
                     PlanRequest(vram=19 * GiB, ctx=110_000, ctx_is_user_choice=True), NO_GPU, None)
    assert plan.ctx == 110_000 and plan.target.n_gpu_layers <= 64
    assert any("target layers fit on the GPU" in w for w in plan.warnings)


def test_overrides_are_inputs(infos):
    plan = make_plan(infos["qwen3.6-27b"], infos["qwen3.5-0.8b"],
                     PlanRequest(vram=24 * GiB, ctx=32768, cache_type_k="q4_0", cache_type_v="q4_0", parallel=1,
                                 draft_max=2, ctx_is_user_choice=True), NO_GPU, None)
    assert (plan.target.type_k, plan.target.type_v, plan.parallel, plan.draft_max) == ("q4_0", "q4_0", 1, 2)
    with pytest.raises(PlanError, match="unknown cache type"):
        make_plan(infos["qwen3.6-27b"], None, PlanRequest(vram=24 * GiB, cache_type_k="q3"), NO_GPU, 4096)
    with pytest.raises(PlanError, match="trained length"):
        make_plan(infos["gemma3-270m"], None, PlanRequest(vram=24 * GiB, ctx=200_000), NO_GPU, None)


def test_free_vram_from_pynvml_when_no_budget_given(infos):
    hw = Hardware(gpus=(Gpu(0, "RTX 4090", 24 * GiB, 23 * GiB, 0),), ram_total=64 * GiB, ram_available=60 * GiB, cpu_count=8)
    plan = make_plan(infos["qwen3.6-27b"], infos["qwen3.5-0.8b"], PlanRequest(), hw, 110_000)
    assert plan.budget == 23 * GiB and "pynvml" in plan.budget_source
    with pytest.raises(PlanError, match="no NVIDIA GPU"):
        make_plan(infos["qwen3.6-27b"], None, PlanRequest(device="cuda"), NO_GPU, 4096)


def test_the_plan_counts_context_checkpoints_in_host_memory(infos):
    """Qwen3.6-27B's checkpoint is its recurrent state without snapshots (149.6 MiB, as llama.cpp logs
    one copy) plus the 0.8B draft's; Gemma 3's is the window's cells of its 52 sliding-window layers."""
    plan = make_plan(infos["qwen3.6-27b"], infos["qwen3.5-0.8b"], PlanRequest(vram=24 * GiB, ram=64 * GiB), NO_GPU, 110_000)
    term = next(t for t in plan.terms if t.name == "context checkpoints")
    assert term.where == "host" and plan.checkpoints == 8
    assert abs(plan.checkpoint_bytes[0] - 149.6 * 1024**2) < 0.01 * plan.checkpoint_bytes[0]
    assert term.bytes == 8 * plan.parallel * sum(plan.checkpoint_bytes) and plan.checkpoint_bytes[1] > 0
    assert plan.to_json()["checkpoints"]["per_slot"] == 8
    gemma = make_plan(infos["gemma3-27b"], infos["gemma3-270m"], PlanRequest(vram=24 * GiB, ram=64 * GiB), NO_GPU, 110_000)
    assert gemma.checkpoints == 8 and gemma.checkpoint_bytes[0] > gemma.checkpoint_bytes[1] > 0
    none = make_plan(infos["qwen3.6-27b"], infos["qwen3.5-0.8b"],
                     PlanRequest(vram=24 * GiB, ram=64 * GiB, ctx_checkpoints=0), NO_GPU, 110_000)
    assert "context checkpoints" not in {t.name for t in none.terms} and none.checkpoints == 0


def test_cpu_pair_planned_in_ram(real_pair):
    t, d = read_model_info(real_pair.target), read_model_info(real_pair.draft)
    plan = make_plan(t, d, PlanRequest(ram=8 * GiB), NO_GPU, 32_768)
    assert plan.device == "cpu" and plan.fits and plan.ctx == 32_768
    assert any(x.name == "target CPU repack copy" and x.bytes > 0 for x in plan.terms)
    assert plan.checkpoints == 0 and "context checkpoints" not in {x.name for x in plan.terms}  # plain attention
    with pytest.raises(PlanError, match="nothing fits"):
        make_plan(t, d, PlanRequest(ram=2 * GiB, ctx=32768, ctx_is_user_choice=True), NO_GPU, None)


def test_flash_attention_off_on_a_cpu_unless_only_it_fits(real_pair, infos):
    t, d = read_model_info(real_pair.target), read_model_info(real_pair.draft)
    plan = lambda ram=8 * GiB, **kw: make_plan(t, d, PlanRequest(ram=ram, ctx=32768, ctx_is_user_choice=True,  # noqa: E731
                                                                 parallel=1, **kw), NO_GPU, None)
    auto = plan()
    assert (auto.target.flash_attn, auto.draft.flash_attn) == (False, False)
    assert plan(flash_attn="on").target.flash_attn is True
    # a quantized V cache needs it: auto takes it, an explicit off is refused with the reason
    assert plan(cache_type_k="q8_0", cache_type_v="q8_0").target.flash_attn is True
    with pytest.raises(PlanError, match="quantized V cache needs flash attention"):
        plan(cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="off")
    # where only its smaller compute buffer fits, auto takes it and keeps the context and f16 cache
    on, off = plan(flash_attn="on", n_ubatch=256), plan(flash_attn="off", n_ubatch=256)
    assert off.used > on.used
    tight = plan(ram=(on.used + off.used) // 2)
    assert tight.target.flash_attn is True and tight.ctx == 32768 and tight.target.type_v == "f16"
    # CUDA: on
    gpu = make_plan(infos["qwen3.6-27b"], infos["qwen3.5-0.8b"], PlanRequest(vram=24 * GiB), NO_GPU, 110_000)
    assert gpu.target.flash_attn is True and gpu.draft.flash_attn is True


# What llama.cpp 0.3.36 reported for the real files, loaded by its native build (AMX_INT8 = 1) on an
# Intel Xeon with AMX (`python scripts/measure_buffers.py` under that build), in MiB: the AMX
# buffer and the CPU_Mapped span. A no-AMX build, as this suite runs on, cannot produce them.
AMX_MEASURED = {"qwen-1.5b": (950.71, 877.31), "qwen-0.5b": (225.48, 325.02), "gemma-270m": (213.91, 235.16)}


def test_amx_copy_matches_what_an_amx_build_allocated(real_pair, gemma_270m):
    files = {"qwen-1.5b": real_pair.target, "qwen-0.5b": real_pair.draft, "gemma-270m": gemma_270m}
    for name, (amx, mapped) in AMX_MEASURED.items():
        info = read_model_info(files[name])
        extra = M.cpu_extra_bytes(info, 0, ("AMX", "CPU_REPACK"))
        assert abs(extra["AMX"] / M.MiB - amx) < 0.01 and extra["CPU_REPACK"] == 0, (name, extra)
        assert abs(M.mapped_report_bytes(info, ("AMX", "CPU_REPACK")) / M.MiB - mapped) < 0.01, name


def test_plan_counts_the_copy_this_build_makes(tiny):
    """An AMX build's plan has an AMX term and no repack term; a build with neither has only the mapped weights."""
    info = read_model_info(tiny.target)
    names = lambda hw: {t.name for t in make_plan(info, None, PlanRequest(), hw, 2048).terms}  # noqa: E731
    assert "target AMX copy" in names(Hardware((), 24 * GiB, 20 * GiB, 2, ("AMX", "CPU_REPACK")))
    assert "target CPU repack copy" in names(Hardware((), 24 * GiB, 20 * GiB, 2, ("CPU_REPACK",)))
    assert not {"target AMX copy", "target CPU repack copy"} & names(Hardware((), 24 * GiB, 20 * GiB, 2, ()))


def test_serve_lets_the_planner_choose_draft_max_for_a_hybrid_model(standins, monkeypatch):
    """`serve` and `up` build their plan request from the settings without overriding draft_max: on the
    hybrid 27B at 110K tokens on a 24 GiB card, 8-token rollback snapshots do not fit and the planner
    falls back to 4; a draft_max the user sets is validated like any plan input."""
    from app.cli import build_parser
    from app.commands.common import plan_request, serve_settings

    hw = Hardware((Gpu(0, "RTX 4090", 24 * GiB, 24 * GiB, 0),), 64 * GiB, 60 * GiB, 8)
    target, draft = read_model_info(standins["qwen3.6-27b"]), read_model_info(standins["qwen3.5-0.8b"])

    def plan_for(*flags: str):
        args = build_parser().parse_args(["serve", "--target", "t.gguf", "--ctx", "110000", *flags])
        settings = serve_settings(args)
        return make_plan(target, draft, plan_request(args, draft_max=settings.draft_max, vram=24 * GiB), hw, 110_000)

    assert plan_for().draft_max == 4
    assert plan_for("--draft-max", "2").draft_max == 2
    monkeypatch.setenv("SPECDECK_DRAFT_MAX", "3")
    assert plan_for().draft_max == 3
    with pytest.raises(Exception, match="draft_max|draft-max|less than or equal"):
        plan_for("--draft-max", "65")


@pytest.mark.real
def test_embedding_context_terms_match_what_llama_cpp_allocates(tiny, real_pair, gemma_270m):
    """The embedding model's planned KV and compute buffer against an Embedder's real context (its
    compute buffer holds a whole ubatch of logits even when pooling: measured, and planned so)."""
    from app.engine.embed import Embedder
    from app.llama.measure import capture_llama_log, parse_allocation
    from app.plan.hardware import detect
    from app.plan.planner import PlanRequest, make_plan

    for name, path in _models(tiny, real_pair, gemma_270m).items():
        info = read_model_info(path)
        plan = make_plan(info, None, PlanRequest(ctx=512, ctx_is_user_choice=True, parallel=1), detect(), 512, info)
        planned = {t.name: t.bytes for t in plan.terms if t.name.startswith("embedding")}
        with capture_llama_log() as lines:
            emb = Embedder(info, plan.embedding, 1)
            assert emb.embed(emb.tokens("def add(a, b):")).shape == (info.n_embd,)
            emb.close()
        got = parse_allocation(lines)
        assert close(planned["embedding KV cache"], got.total("KV"), 0.03), name
        assert close(planned["embedding compute buffer"], got.total("compute"), 0.10), name
