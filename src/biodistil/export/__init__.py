"""Deployment: a fine-tuned model (or a masked LM) as ONNX graphs and what is deployed, scored.

`onnx` (the unfused fp32 graph, dynamic int8 quantisation, parity with PyTorch), `fusion` (the fused graph of BERT-
family models: ONNX Runtime's transformer optimizer), `smoothing` (SmoothQuant's migration before int8,
`--int8-smooth`), `runtime` (`OnnxModel`, an ONNX Runtime session called like the Hugging Face model; the export
folder's format), `command` (`biodistil export`: graphs checked, scored side by side, the int8 scheme picked by the
accuracy gate, written in one rename), `card` (the export folder's README.md), `deployed` (a model folder, an export
folder or one graph, named, loaded, checked against a task and scored without training; used by `evaluate --finetuned`
and `bench`) and `predict` (`Predictor` and `biodistil predict`: documents labelled by a deployed model through the task
encoding, with the model's own head and labels as its `tasks.encoding.EncodingSpec`). The Hugging Face folder a run
writes is `biodistil.models.saving`, its model card `biodistil.training.card`. The ONNX packages are the optional extra
`export`, imported lazily.
"""
