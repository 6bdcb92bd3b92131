"""gRPC invocation: a listener of its own (`entry`) proxying any service and method of a
gRPC function (inferenceUrl `/gRPC`) through the engine, over channels to the workers
(`channels`); the engine's refusals and failures as gRPC statuses (`statuses`)."""
