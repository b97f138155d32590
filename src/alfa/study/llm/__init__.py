"""The paper's §4.8 in miniature: a small masked-diffusion language model made here (``model``), generated
reasoning tasks with checkers (``tasks``), its cached pretraining (``pretrain``), adaptation by Alfa, LoRA,
DoRA and full fine-tuning (``adapt``), the bench that runs them (``bench``) and docs/llm.md (``report``)."""
