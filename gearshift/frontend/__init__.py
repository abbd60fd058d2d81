"""The serving frontend: requests in and text out around the engine's step. AsyncEngine
(the event loop's side), the step loop on a thread (engine_loop) or in a process of its
own (engine_process), and OutputProcessor (detokenising, stop strings)."""
