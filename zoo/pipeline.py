"""Pipeline stages of a decoder or an encoder: the blocks of its stack cut into contiguous runs,
one per device, each run a module that takes the previous stage's hidden states and hands its own
to the next (GPipe: Huang et al. 2019, https://arxiv.org/abs/1811.06965; the 1F1B schedule:
Narayanan et al. 2021, https://arxiv.org/abs/2104.04473, section 2.2). The schedules themselves
are torch's (torch.distributed.pipelining); this module only says what each stage computes.

Stage s of N holds blocks ``stage_layers(L, N)[s]``; the first also holds the token (segment and
learned position) embeddings and the embedding norm, the last the final norm and the heads (a
decoder's LM head, an encoder's pooler and MLM head): what the form declares in its ``pipeline_cut``
(``zoo.zoo_model.PipelineCut``). Only hidden states (B, T, D) travel between
stages: every stage makes the masks, positions and rotary angles of its own blocks from the batch's
padding mask and document ids, which each stage is given (they are small and the same for all). A
head tied to the token embedding reads it on the last stage: that stage keeps its own copy of it,
and whoever trains the stages sums the two copies' gradients (:func:`tied_embedding`) so that both
take the same step.

What cannot be cut this way is refused in one line (:func:`check_pipeline`): settings whose tensors
cross from one layer to every later one (``value_residual``, a bias table shared by every layer),
and auxiliary losses that a stage could not add to the last stage's loss (an MoE router's)."""

from __future__ import annotations

from torch import Tensor, nn

from zoo.blocks import Stack
from zoo.models import ZooModel
from zoo.registry import ConfigError
from zoo.sublayer import Sublayer


def stage_layers(n_layers: int, stages: int) -> list[range]:
    """Contiguous runs of blocks, one per stage, as even as they can be (the first stages take the
    remainder): 5 layers over 2 stages are 0..2 and 3..4."""
    if stages < 1 or n_layers < stages:
        raise ConfigError(
            f"model.n_layers={n_layers} cannot be cut into {stages} pipeline stages: each stage needs one "
            f"block at least; use trainer.devices <= {n_layers}"
        )
    base, extra = divmod(n_layers, stages)
    starts = [s * base + min(s, extra) for s in range(stages + 1)]
    return [range(starts[s], starts[s + 1]) for s in range(stages)]


def check_pipeline(model: ZooModel, stages: int) -> None:
    """Raise ConfigError (one line) for what cannot run as ``stages`` pipeline stages."""
    if model.pipeline_cut is None:
        raise ConfigError(
            f"arch={model.config.arch!r}: trainer=pp cuts the blocks of a decoder or an encoder into stages; "
            f"train this form with trainer=ddp, fsdp or tp"
        )
    cfg, stack = model.config, pipeline_stack(model)
    stage_layers(len(stack.blocks), stages)
    if cfg.value_residual:
        raise ConfigError(
            "model.value_residual=true mixes the first layer's values into every later layer, which live on "
            "other pipeline stages; set it false, or use trainer=ddp, fsdp or tp"
        )
    if stack.position.has_bias and any(True for _ in stack.position.parameters()):
        raise ConfigError(
            f"position={cfg.position!r}: one learned bias table serves the layers of every pipeline stage; "
            f"choose position=rope or alibi, or trainer=ddp, fsdp or tp"
        )
    if any(type(m).aux_losses is not Sublayer.aux_losses for m in model.modules() if isinstance(m, Sublayer)):
        raise ConfigError(
            f"ffn={cfg.ffn!r} adds auxiliary losses in every layer, which trainer=pp cannot carry to the last "
            f"stage's loss; choose a dense ffn, or trainer=ddp or fsdp"
        )


def pipeline_stack(model: ZooModel) -> Stack:
    """The stack whose blocks a form's pipeline stages share out (its ``pipeline_cut``)."""
    assert model.pipeline_cut is not None, "check_pipeline refuses a form without a pipeline cut"
    return model.pipeline_cut.of(model)


class Stage(nn.Module):
    """Stage ``index`` of ``stages`` of a decoder or an encoder, built by pruning ``model`` in place:
    the blocks of other stages are dropped (empty ``nn.Identity`` slots keep every block's name, so a
    stage's ``state_dict`` keys are the whole model's), and so are the embeddings and heads where this
    stage does not use them. Parameters a stage keeps but never uses (a learned position table past the
    first stage) are frozen there.

    ``forward(x, attention_mask, document_ids, token_type_ids)``: x is (B, T) token ids on the first
    stage, else the previous stage's (B, T, D) hidden states; returns hidden states (B, T, D), after
    the final norm on the last stage (the form's heads, ``ZooModel.logits`` or an encoder's
    ``mlm_logits`` and ``pool``, read them there)."""

    def __init__(self, model: ZooModel, index: int, stages: int) -> None:
        super().__init__()
        check_pipeline(model, stages)
        self.model, cut = model, model.pipeline_cut
        assert cut is not None  # check_pipeline refused a form without one
        stack = cut.of(model)
        self.layers = stage_layers(len(stack.blocks), stages)[index]
        self.first, self.last = index == 0, index == stages - 1
        tied = self.last and type(model).ties_head(model.config)  # the last stage's head reads the embedding
        for i in range(len(stack.blocks)):
            if i not in self.layers:
                stack.blocks[i] = nn.Identity()
        if not self.first:
            stack.embed_norm = None
            stack.position.requires_grad_(False)  # a learned table is the first stage's
            for name in cut.first:
                if not (name == "embed" and tied):
                    setattr(model, name, None)
        if not self.last:
            stack.final_norm = None
            for name in cut.last:
                setattr(model, name, None)

    def copies(self) -> list[nn.Parameter]:
        """Parameters this stage holds that are the first stage's (a tied embedding on the last stage, a
        learned position table): a whole count or norm takes them from the first stage alone."""
        if self.first:
            return []
        model = self.model
        return list(pipeline_stack(model).position.parameters()) + ([] if model.embed is None else [model.embed.weight])

    def forward(
        self,
        x: Tensor,
        attention_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        stack = pipeline_stack(self.model)
        if self.first:
            x = self.model.embed_inputs(x, token_type_ids)
        inputs = stack.prepare(x, padding_mask=attention_mask, document_ids=document_ids, layers=self.layers)
        if self.first:
            x = stack.embedded(x, inputs.position_ids)
        x = stack.run(x, inputs, layers=self.layers)
        return stack.finish(x) if self.last else x


def tied_embedding(stage: Stage) -> nn.Parameter | None:
    """The token embedding when this stage holds one copy of a tied pair (the first and the last stage
    of a model whose head reads it), else None: these copies' gradients are summed over the two
    stages before each step, and the first stage's copy is the one a checkpoint keeps."""
    model = stage.model
    tied = type(model).ties_head(model.config) and model.embed is not None and stage.first != stage.last
    return model.embed.weight if tied else None


__all__ = ["Stage", "check_pipeline", "pipeline_stack", "stage_layers", "tied_embedding"]
