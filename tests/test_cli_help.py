"""Every ``fleethub`` command and flag says what it is for, and ``fleethub --version`` answers."""

from __future__ import annotations

import argparse
import subprocess

from hub.cli import build_parser
from tests.e2e.clitools import clean_env, fleethub_exe


def undocumented(parser: argparse.ArgumentParser, path: str | None = None) -> list[str]:
    """The commands and flags under ``parser`` whose help is empty, as ``fleethub admin create-org --tier``."""
    path = path or parser.prog
    if hasattr(parser, "build"):
        parser.build()  # admin's arguments are added when it parses (hub/cli.py _Deferred)
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            described = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not (described.get(name) or "").strip():
                    missing.append(f"{path} {name}")
                missing += undocumented(sub, f"{path} {name}")
        elif action.help != argparse.SUPPRESS and not (action.help or "").strip():
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_command_and_flag_has_help():
    assert undocumented(build_parser()) == []


def test_the_walk_finds_what_has_no_help():
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--quiet", help="")
    sub = parser.add_subparsers(dest="command")
    bare = sub.add_parser("bare")
    bare.add_argument("name")
    sub.add_parser("told", help="something").add_argument("--flag", help="a flag")
    assert undocumented(parser) == ["x --quiet", "x bare", "x bare name"]


def test_cluster_is_in_the_top_level_help():
    text = build_parser().format_help()
    for command in ("serve", "demo", "cluster", "admin", "agent", "sim", "tunnel", "device-test"):
        assert f"    {command} " in text, command


def test_admin_has_no_bind_flags():
    admin = build_parser()._subparsers._group_actions[0].choices["admin"].build()
    flags = {flag for action in admin._actions for flag in action.option_strings}
    assert "--data-dir" in flags and not flags & {"--host", "--port"}


def test_version():
    done = subprocess.run([fleethub_exe(), "--version"], check=False, capture_output=True, text=True, timeout=60,
                          env=clean_env(), stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and done.stderr == ""
    name, version = done.stdout.split()
    assert name == "fleethub" and version[0].isdigit(), done.stdout
