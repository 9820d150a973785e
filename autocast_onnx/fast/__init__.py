"""The fast path: speed machinery of `convert_file` that changes no output byte.

Everything here is an optimisation of a model file converted to fp16 in memory, and each piece
falls back to the plain path when it is unsure (a walk that disagrees with protobuf's parse, a
worker that fails, an encoding the splice does not expect): the output is the same either way.

  worker.py       a process forked before the load: one walk of the file for the loader and the
                  weight screen, on the second core (standard library only, so the command line
                  may fork it before it imports onnx and numpy)
  wire.py         the walk of the file's protobuf encoding (checked against protobuf's parse)
  screen.py       the weight screen's parent half: the worker's fp16 conversions of the main
                  graph's weights, checked against the loaded model
  screen_work.py  the screen's half that runs in the worker
  in_file.py      a parse that leaves the large fp32 payloads in the file (io.load_model's `parse`)
  splice.py       converted payloads held outside their tensors and spliced into the encoding at
                  the save, written as pieces (writev); the stand-in the output check reads

The fence: only the pipeline and the command line import this package
(tests/contracts/test_import_layers.py). The stages see narrow, plain interfaces instead: the loader takes
a `parse` callable and hands back what it left in the file (io.LeftInFile); classification takes
a plain cache of converted weights (id(TensorProto) -> fp16 bytes); the rewrite takes one payload
sink (rewrite.apply.PayloadSink: io.PayloadSpill or splice.HeldPayloads); the checker takes bytes
or a model, and the choice between the stand-in and the whole bytes is splice.check_with_stand_in's.
"""
