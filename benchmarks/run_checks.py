"""What a run's checks cost beside the partitioned step itself.

For the README's two-layer GPT-2 (a batch of 8 x 128) and the tour's small GPT-2 (8 x 16),
under BP+MP on 8 virtual CPU devices: the partitioned step's compile and its timed steps
(warm-up and 5 repeats, as ``run`` times them), then the checks: the unpartitioned
reference (compile and run) and the float64 reference with its rounding scales (one
compile, three runs), and ``run()`` as a whole, cold and with the references kept.
Run: ``python -m benchmarks.run_checks``.
"""

from benchmarks._common import machine, table  # noqa: I001  (sets up the devices first)

import time
import warnings

import jax
import optax

import workbench as wb
from workbench.core.lowering.interpret import Interpreter
from workbench.core.lowering.rounding import reference_with_scales
from workbench.core.lowering.run import TrainingStep, example_inputs


def gpt2_step(seq: int, vocab: int, positions: int):
    from transformers import FlaxGPT2LMHeadModel, GPT2Config

    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=vocab, n_positions=positions,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = FlaxGPT2LMHeadModel(config, seed=0)
    optimizer = optax.adamw(optax.linear_schedule(0.0, 1e-3, 100))

    def train_step(params, opt_state, batch):
        def loss_fn(params):
            logits = model(batch["input_ids"], params=params).logits
            return optax.softmax_cross_entropy_with_integer_labels(
                logits[:, :-1], batch["input_ids"][:, 1:]
            ).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    batch = {"input_ids": jax.random.randint(jax.random.key(0), (8, seq), 0, vocab)}
    return wb.capture(train_step, model.params, optimizer.init(model.params), batch)


def seconds(fn) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def measure(name: str, program) -> list:
    session = wb.Session(
        program, wb.Mesh({"batch": 2, "model": 4}), [wb.BP("batch"), wb.MP("model")]
    )
    flat = example_inputs(program)
    t0 = time.perf_counter()
    step = TrainingStep(session, flat)
    compile_s = time.perf_counter() - t0
    steps_s = sum(seconds(lambda k=k: step(keep=k == 0)) for k in range(6))
    unpart_s = seconds(lambda: jax.jit(Interpreter(program))(*flat))
    rounding_s = seconds(lambda: reference_with_scales(program, flat)[0])
    checks = unpart_s + rounding_s
    partitioned = compile_s + steps_s
    cold = seconds(lambda: session.run().outputs)
    warm = seconds(lambda: session.run().outputs)
    return [
        name, f"{compile_s:.1f}", f"{steps_s:.2f}", f"{unpart_s:.1f}", f"{rounding_s:.1f}",
        f"{checks / partitioned:.2f}", f"{cold:.1f}", f"{warm:.1f}",
    ]  # fmt: skip


def main() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = [
            measure("README GPT-2 (8 x 128)", gpt2_step(128, 50257, 1024)),
            measure("tour GPT-2 (8 x 16)", gpt2_step(16, 256, 16)),
        ]
    print(f"# What a run's checks cost ({machine()})\n")
    headers = [
        "program", "step compile s", "6 steps s", "unpartitioned ref s", "float64 + scales s",
        "checks / step", "run() cold s", "run() again s",
    ]  # fmt: skip
    print(table(headers, rows))


if __name__ == "__main__":
    main()
