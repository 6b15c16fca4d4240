"""Diagnostics: kernel Stein discrepancy (:mod:`~numpyro_sg.diagnostics.ksd`) and FSSD."""
