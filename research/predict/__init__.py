"""A restored run answers raw input: one module per experiment, each a pure function of the run
(`research.training.restore`) and the input, batched and jit-compiled.

    from research import predict, training
    run = training.restore("runs/nmt_dates-20261126-120000")
    predict.translate(run, ["14 janvier 2024", "2024年1月14日"]).outputs

Input the run's model cannot take is refused with one research.errors.InputError naming the
offending part and what the model takes, before anything compiles.
"""
