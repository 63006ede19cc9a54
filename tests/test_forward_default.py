"""Calibration and ``--real`` run the forward ``serve`` runs unless told otherwise."""

from __future__ import annotations

from aioserve.cli import build_parser
from aioserve.commands import common, simulate_options


def test_calibrate_and_real_default_to_serves_forward():
    parser = build_parser()
    serve = common.engine_config(parser.parse_args(["serve", "--model", "m"]))
    for argv in (["calibrate"], ["simulate", "--real"]):
        args = parser.parse_args([*argv, "--model", "m"])
        assert simulate_options.engine_config(args).forward == serve.forward == "auto"


def test_simulate_forward_is_checked_and_overridable():
    parser = build_parser()
    args = parser.parse_args(["simulate", "--real", "--model", "m", "--forward", "transformers"])
    assert simulate_options.engine_config(args).forward == "transformers"
