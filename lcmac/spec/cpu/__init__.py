"""What the CPU targets are: the templates' knobs (``config``), and per instruction set the
features code needs and what this CPU has (``x86``, ``aarch64``)."""
