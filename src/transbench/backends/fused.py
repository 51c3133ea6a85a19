"""transbench's own fused engine (transbench.engine): packed tokens, fused kernels, CUDA graphs."""

from __future__ import annotations

from .base import Backend, Prepared

SERVER_TOKEN_GROWTH = 1.25  # each packed size of a server's ladder at most 1.25x the one below
CACHE_VARIABLE = "TRANSBENCH_CACHE_DIR"  # the folder of the engine's tuning table (engine/tuning.py cache_path)


def check_cache_dir() -> None:
    """$TRANSBENCH_CACHE_DIR read at the input boundary (boundary.env_folder), and its tuning table checked as
    `tune` checks its own (tuning.table_problem), before anything runs. The engine reads the variable itself, as it
    depends on nothing of the benchmark; unchecked, a value naming a file, a pipe or a folder no one may write ran
    every cell with its tuning kept nowhere, without a word, and one holding a newline made a folder so named."""
    from ..boundary import BadInput, env_folder
    from ..engine import tuning

    folder = env_folder(CACHE_VARIABLE)
    if folder is None:
        try:  # the default under the home folder, which a user with no passwd entry and no HOME does not have
            tuning.cache_path()
        except RuntimeError:
            raise BadInput(f"the fused engine has no folder for its tuning table: HOME is unset and this user has no "
                           f"home folder; set {CACHE_VARIABLE} (or XDG_CACHE_HOME) to a folder you can write") from None
        return
    table = folder / tuning.TABLE_NAME
    problem = tuning.table_problem(table)
    if problem:
        raise BadInput(f"cannot use the tuning table {table} (from ${CACHE_VARIABLE}): {problem}; set "
                       f"{CACHE_VARIABLE} to a folder you can write (or delete a damaged table), or unset it")


def _compile(model, cell, options=None):
    """The engine for `cell`'s model; options: EngineOptions (None: the engine as shipped), for scripts that measure
    one of its switches through the backend (benchmarks/studies/order_latency.py --no-pdl)."""
    from ..engine import EngineUnsupported, compile_model
    from ..engine.compiled import BERT_LIKE
    from ..engine.tuning import TUNE_BUDGET_S
    from ..errors import Unsupported

    # A family the engine has no loader for is refused before the engine's options are built from its config: XLNet's
    # max_position_embeddings (-1, transformers' "no limit") failed their check first, an `error` cell where every
    # other such family reads `unsupported`.
    kind = model.config.model_type
    if kind not in (*BERT_LIKE, "gpt2"):  # the engine's own words (engine/compiled.py _engine_for)
        raise Unsupported(f"{type(model).__name__} (model_type={kind!r}): the engine runs {', '.join(BERT_LIKE)} and "
                          "gpt2 only")
    p = next(model.parameters())
    # A cell's figures are those of the engine tuned for its shape, whatever ran before it. Under the first-call
    # budget the first cell of a process spent it on Triton compiles and kept default routes, which later cells,
    # finding the kernels compiled, did not: on an H100 bert-base fp16 1 x 128 ran in 0.5152 ms as a process's first
    # cell, 0.4474 after a 1 x 64 cell, and 0.3296 tuned (benchmarks/results/fp16_grids_h100_2026-11.md); the
    # default routes, saved as partial entries, stayed with later budgeted processes. So a `run` cell tunes fully, as
    # `transbench tune` does, unless its routes are on disk. Serving keeps the budget (Cell.first_call_budget): its
    # warm-up captures a graph per packed token count, each a shape to tune (untuned ops there borrow the routes of
    # the nearest tuned shape, engine/tuning.py Tuner.choose, and the info's route_origins counts them).
    budget = TUNE_BUDGET_S if cell.first_call_budget else None
    # A server (serving, the demo) bounds its graphs: packed sizes on a ladder each at most SERVER_TOKEN_GROWTH above
    # the one below (engine/packing.py token_ladder states the worst-case padding), not every multiple of 128:
    # bert-base 32 x 512 captured and tuned 128 graphs per batch size before its load (260 s on an H100).
    growth = SERVER_TOKEN_GROWTH if cell.first_call_budget else None
    # fp32/tf32 cells run the engine in fp32; CUDA graphs only where there is CUDA. An fp8 cell's model is stored in
    # fp16 (measure/device.py torch_dtype): the engine quantizes its linear layers to e4m3.
    try:
        return compile_model(model, dtype=p.dtype, device=p.device, max_batch=max(cell.batch, 1),
                             fp8=cell.dtype == "fp8", tune_budget_s=budget, options=options,
                             token_growth=growth)
    except EngineUnsupported as exc:
        raise Unsupported(exc.reason) from None


def _padding_read(model, inputs) -> str | None:
    """Why the model's head would read a padding position of these inputs, or None: the engine's own check
    (engine/compiled.py padding_read), made before compiling so that such a cell reads `unsupported`. The engine
    computes real tokens only (padding positions come back as zeros), so such a head's output cannot match
    transformers': GPT2ForSequenceClassification on a gpt2 checkpoint whose pad id is outside its vocabulary, or
    --encoders-only with --seq-stdev 4, read `wrong` (rel_err 0.92)."""
    from ..engine.compiled import padding_read, reads_padding

    if not reads_padding(model):
        return None
    return padding_read(model, {"input_ids": inputs.input_ids, "inputs_embeds": inputs.inputs_embeds,
                                "attention_mask": inputs.attention_mask})


def _prepare(model, inputs, cell) -> Prepared:
    import torch

    from ..errors import Unsupported

    reason = _padding_read(model, inputs)
    if reason:
        raise Unsupported(reason)
    compiled = _compile(model, cell)
    kwargs = inputs.model_kwargs()
    if not cell.embeddings and model.config.model_type == "bert":
        # The scenario froze BERT's embedding block (encoders-only): run the engine's layers on its output.
        with torch.inference_mode():
            compiled.backbone.fixed_embeddings = model.base_model.embeddings(
                input_ids=inputs.input_ids, token_type_ids=inputs.token_type_ids)

    fn = compiled.fixed_call(**kwargs)  # the same inputs every call: their padding check made once (engine)

    def ran():
        from ..engine.tuning import ORIGINS

        tuning = compiled.tuning()
        out = {"engine_tuning": tuning}
        if tuning:
            # Where the routes its graphs run came from (engine/tuning.py ORIGINS): a budgeted first call (serving,
            # the demo) may run routes borrowed from a nearby tuned shape or the shape rule's, not yet timed.
            origins = [t["origins"] for t in tuning.values() if t.get("origins")]
            out["route_origins"] = {o: sum(c.get(o, 0) for c in origins) for o in ORIGINS}
        if not compiled.opts.fp8:
            return out
        # An fp8 cell runs fp16 GEMMs where the tuner found them faster, and a call under engine.ops.FP8_MIN_ROWS
        # tokens runs the fp16 forward: its record says how many GEMM ops really took an fp8 route.
        gemms = [r for t in tuning.values() for op, r in (t["routes"] or {}).items() if op.startswith("linear")]
        return {**out, "fp8_gemm_ops": sum(r.startswith("fp8") for r in gemms), "gemm_ops": len(gemms)}

    graphs = compiled.engine.graphs.enabled
    B, S = inputs.input_ids.shape if inputs.input_ids is not None else inputs.inputs_embeds.shape[:2]
    return Prepared(fn, {"engine_ops": compiled.engine.ops.name, "cuda_graphs": graphs}, ran=ran,
                    token_bucket=compiled.token_bucket if graphs else 0, graphs=lambda: compiled.graph_captures,
                    release=compiled.release if graphs else None,
                    token_sizes=compiled.token_sizes(B, S) if graphs else (), tune_budget=compiled.set_tune_budget,
                    reuse_captured=compiled.set_reuse_captured if graphs else None)


def _generator(model, cell):
    from ..engine import EngineUnsupported
    from ..errors import Unsupported

    try:
        return _compile(model, cell).generator(cell.batch, cell.positions)
    except EngineUnsupported as exc:
        raise Unsupported(exc.reason) from None


BACKEND = Backend(
    name="fused",
    attn="sdpa",
    attn_fallback="eager",  # the engine runs its own attention; a family it cannot run says so itself
    dtypes=("fp32", "tf32", "fp16", "bf16", "fp8"),
    prepare=_prepare,
    generator=_generator,
    packs=True,
    quant_refusal="the fused engine quantizes on its own (--dtype fp8) and takes --quant none only",
    describe="transbench.engine: fused QKV, Triton bias+GELU / residual+LayerNorm, packed varlen, CUDA graphs, fp8",
    per_shape=True,
    check_environment=check_cache_dir,
)
