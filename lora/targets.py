"""Where LoRA attaches in a model: PEFT module names mapped onto the model's fused projections.

Our Llama-family decoder fuses q/k/v into one `qkv` projection and gate/up into `gate_up`
(engine/models/llama.py). A PEFT adapter targets the unfused modules; each module's B writes
its own row range of the fused output and its A/B pair takes its own run of rank columns in the
projection's stacked buffers (see lora/slots.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LLAMA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class LoraTarget:
    """One PEFT module: its fused projection, the projection's input width, and the rows
    `[out_offset, out_offset + out_features)` of the projection output it writes."""

    module: str
    projection: str
    in_features: int
    out_features: int
    out_offset: int


@dataclass(frozen=True, slots=True)
class LoraModelSpec:
    """The LoRA-visible shape of a base model: layer count and every targetable module."""

    num_layers: int
    targets: dict[str, LoraTarget] = field(default_factory=dict)

    def projection_modules(self) -> dict[str, list[LoraTarget]]:
        """Fused projection name -> its modules, in declaration order."""
        out: dict[str, list[LoraTarget]] = {}
        for target in self.targets.values():
            out.setdefault(target.projection, []).append(target)
        return out

    def projection_shape(self, projection: str) -> tuple[int, int]:
        """(in_features, total out_features) of a fused projection."""
        modules = self.projection_modules()[projection]
        return modules[0].in_features, sum(m.out_features for m in modules)


def llama_lora_spec(
    num_layers: int, hidden_size: int, q_size: int, kv_size: int, intermediate_size: int
) -> LoraModelSpec:
    """Targets of engine/models/llama.py's decoder: `qkv` (q, k, v rows in that order), `o`,
    `gate_up` (gate then up rows) and `down`; sizes in features (q_size = heads * head_dim)."""
    rows = [
        ("q_proj", "qkv", hidden_size, q_size, 0),
        ("k_proj", "qkv", hidden_size, kv_size, q_size),
        ("v_proj", "qkv", hidden_size, kv_size, q_size + kv_size),
        ("o_proj", "o", q_size, hidden_size, 0),
        ("gate_proj", "gate_up", hidden_size, intermediate_size, 0),
        ("up_proj", "gate_up", hidden_size, intermediate_size, intermediate_size),
        ("down_proj", "down", intermediate_size, hidden_size, 0),
    ]
    return LoraModelSpec(num_layers, {m: LoraTarget(m, p, i, o, off) for m, p, i, o, off in rows})
