"""The option table (pffs.optiontable) walked through every front end: each option is spelled
as the table says in the CLI, mount(8)'s -o, Fluid's options, the CSI volume attributes and
pffs.toml, and a value given there reaches `pffs mount`'s parsed options as the table's parser
reads it."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from pffs import config as config_module
from pffs.cli import mounthelper
from pffs.cli.fluidconfig import SOURCE_KEYS, mount_arguments
from pffs.cli.fluidpolicy import DATA_OPTIONS
from pffs.cli.options import build_parser
from pffs.config import SourceConfig
from pffs.csi import params
from pffs.optiontable import OPTIONS, SWITCH, Option, build, camel, defaults
from pffs.optionvalues import BadValue, boolean
from pffs.routing.tablefile import parse_table

CLI_OPTIONS = [option for option in OPTIONS if option.cli]
# Spellings that are not the table's rule, each on purpose: the mount table file and the
# attributes took the short name of the endpoint before the table existed.
TOML_EXCEPTIONS = {"endpoint-url": "endpoint", "hdfs-user": "user"}
CSI_EXCEPTIONS = {"endpoint-url": "endpoint"}
CANDIDATES = (
    "64M",
    "3",
    "600",
    "0.5",
    "warning",
    "memory",
    "off",
    "true",
    "x",
    ":9567",
    "dns://group.local:7070",
    "s3://near/blocks",
)


def sample(option: Option) -> tuple[str, object]:
    """A text the option's parser takes, and its value, which is not the default."""
    for text in CANDIDATES:
        try:
            value = option.parse(text)
        except BadValue:
            continue
        if value != option.default_value():
            return text, value
    raise AssertionError(f"no sample for {option.name}")


def parsed(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def mount_actions() -> dict[str, argparse.Action]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        flag: action
        for action in commands.choices["mount"]._actions
        for flag in action.option_strings
    }


def test_every_mount_flag_is_in_the_table() -> None:
    """The parser of `pffs mount` has no option the table lacks (but help, foreground, config)."""
    flags = {flag for flag in mount_actions() if flag.startswith("--")}
    from_table = {option.flag for option in CLI_OPTIONS}
    renamed = {f"--{old}" for option in OPTIONS for old in option.renamed}
    tristate = {f"--no-{option.name}" for option in OPTIONS if option.form == "tristate"}
    assert flags - {"--help", "--foreground", "--config"} == from_table | renamed | tristate


@pytest.mark.parametrize("option", CLI_OPTIONS, ids=lambda o: o.name)
def test_cli_flag(option: Option) -> None:
    text, value = sample(option)
    given = option.argv(value) if option.form != "value" else [option.flag, text]
    args = parsed(["mount", "s3://bkt", "/mnt/x", *given])
    assert getattr(args, option.dest) == value
    if option.name != "debug":  # given before the subcommand too, where it has its default
        assert getattr(parsed(["mount", "s3://bkt", "/mnt/x"]), option.dest) == (
            option.default_value()
        )


@pytest.mark.parametrize("option", CLI_OPTIONS, ids=lambda o: o.name)
def test_mount_helper_option(option: Option) -> None:
    text, value = sample(option)
    assert mounthelper.mount_options()[option.o_name] is option
    if option.takes_value:
        given = f"{option.o_name}={text}"
    else:
        given = option.o_name if value else f"no_{option.o_name}"
    args = parsed(mounthelper.translate("s3://bkt", "/mnt/x", [given]))
    assert getattr(args, option.dest) == value


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_fluid_option(option: Option) -> None:
    text, value = sample(option)
    if option.scope == "source":
        assert SOURCE_KEYS[option.name] is option
    if option.cli and option.name != "credentials-file":  # keys come from encryptOptions
        args = mount_arguments("/mnt/x", {option.name: ("test", text)})
        assert getattr(args, option.dest) == value
    assert (option.dest in DATA_OPTIONS) is option.dataset


def test_the_dataset_may_set_only_data_options() -> None:
    """The Fluid allowlist as it stood before the table (pffs.cli.fluidpolicy): a security
    boundary, so a change to it shows here."""
    assert {
        "read_only",
        "readahead_max",
        "block_size",
        "metadata_ttl",
        "attr_ttl",
        "entry_ttl",
        "dir_ttl",
        "negative_ttl",
        "preload",
        "preload_budget",
        "retries",
        "retry_timeout",
        "request_timeout",
        "connect_timeout",
    } == DATA_OPTIONS


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.csi], ids=lambda o: o.name)
def test_csi_attribute(option: Option) -> None:
    assert option.csi == CSI_EXCEPTIONS.get(option.name, camel(option.name))
    text, value = sample(option)
    spec = params.volume_spec({"source": "s3://bkt/x", str(option.csi): text})
    args = parsed(["mount", spec.source, "/mnt/x", *spec.mount_options()])
    assert getattr(args, option.dest) == value


def test_csi_keys_are_the_tables() -> None:
    """Every attribute but the volume's data (source, mountTable) and its joining the node's
    cache group (cacheGroup: the driver's own --group-* options) is a row of the table."""
    volume_only = {"source", "mountTable", "cacheGroup"}
    assert volume_only | {o.csi for o in OPTIONS if o.csi} == params.VOLUME_KEYS
    assert {"cacheMemory", "cacheSize", "readaheadMax", "blockSize"} == params.SIZE_KEYS
    assert params.RENAMED_KEYS == {"prefetchMax": "readaheadMax", "datasetPrefetch": "preload"}


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.toml], ids=lambda o: o.name)
def test_mount_table_key(option: Option) -> None:
    assert option.toml == TOML_EXCEPTIONS.get(option.name, option.dest)
    text, value = sample(option)
    typed = value if option.toml_type is not str else text
    # A directory's source: nothing there looks the S3 options up (a profile, an endpoint).
    document = {"mount": [{"path": "/a", "source": "file:///tmp", str(option.toml): typed}]}
    (entry,) = parse_table(document, SourceConfig(url=""), "pffs.toml")
    fields = dataclasses.asdict(entry.source) | {"cache": entry.cache}
    assert fields[option.dest] == typed


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.renamed], ids=lambda o: o.renamed[0])
def test_former_names_work_in_every_front_end(
    option: Option, capsys: pytest.CaptureFixture[str]
) -> None:
    text, value = sample(option)
    for old in option.renamed:
        assert getattr(parsed(["mount", "s3://b", "/m", f"--{old}", text]), option.dest) == value
        argv = mounthelper.translate("s3://b", "/m", [f"{old.replace('-', '_')}={text}"])
        assert getattr(parsed(argv), option.dest) == value
        assert getattr(mount_arguments("/m", {old: ("test", text)}), option.dest) == value
    assert "deprecated" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("Yes", True), ("on", True), ("1", True), ("off", False), ("0", False)],
)
def test_one_boolean_rule(text: str, value: bool) -> None:
    assert boolean(text) is value
    assert params.parse_bool("readOnly", text) is value


@pytest.mark.parametrize("text", ["", " ", "maybe", "2"])
def test_a_boolean_is_never_guessed(text: str) -> None:
    with pytest.raises(BadValue, match="is not true or false"):
        boolean(text)


def test_each_front_end_reads_an_empty_boolean_by_its_syntax() -> None:
    """A bare key in a list of options is a switch turned on; an empty attribute is not given."""
    assert parsed(mounthelper.translate("s3://b", "/m", ["ro", "allow_other"])).allow_other
    assert mount_arguments("/m", {"read-only": ("MOUNT_OPTIONS.ro", "")}).read_only
    assert "readOnly" not in params.volume_spec({"source": "s3://b/x", "readOnly": ""}).options
    with pytest.raises(SystemExit):
        parsed(["mount", "s3://b", "/m", "--preload", ""])


def test_switches_are_switches_everywhere() -> None:
    switches = {option.name for option in OPTIONS if option.form == SWITCH}
    assert switches == {"read-only", "allow-other", "debug"}


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.fills], ids=lambda o: o.name)
def test_each_row_names_the_config_fields_it_fills(option: Option) -> None:
    for config_name, field in option.fields:
        config = getattr(config_module, config_name)
        assert field in {f.name for f in dataclasses.fields(config)}, option.fills


def test_every_row_fills_a_config_field() -> None:
    assert [option.name for option in OPTIONS if not option.fields] == []


@pytest.mark.parametrize(
    "config",
    [
        config_module.CacheConfig,
        config_module.MetaConfig,
        config_module.PreloadConfig,
        config_module.OrderLimits,
        config_module.RetryConfig,
        config_module.ObserveConfig,
    ],
    ids=lambda c: c.__name__,
)
def test_the_tables_defaults_build_the_configs_defaults(config: type) -> None:
    """A command line that gives no option means what the configs say by themselves."""
    assert build(config, defaults()) == config()


def test_a_row_later_in_the_table_beats_an_earlier_one() -> None:
    given = defaults() | {"metadata_ttl": 5.0, "entry_ttl": 7.0}
    assert build(config_module.MetaConfig, given) == config_module.MetaConfig(5.0, 7.0, 5.0)


@pytest.mark.parametrize(
    ("flag", "text", "complaint"),
    [
        ("--preload-budget", "0", "is not a size above 0"),
        ("--order-timeout", "0", "is not a positive number of seconds"),
        ("--order-timeout", "inf", "is not a positive number of seconds"),
        ("--metrics", "9567", "is not HOST:PORT"),
        ("--metrics", "localhost:99999", "is not HOST:PORT"),
    ],
)
def test_ranges_and_forms_are_the_parsers(
    flag: str, text: str, complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What config building used to refuse by hand, argparse refuses through the parser."""
    with pytest.raises(SystemExit):
        parsed(["mount", "s3://b", "/m", flag, text])
    assert f"argument {flag}: {text!r} {complaint}" in capsys.readouterr().err


def test_the_csi_drivers_group_flags_are_the_mounts() -> None:
    """`pffs csi`'s group flags are the table's rows `pffs mount` has: the same parser, unit
    and help (dns:// included), and what the driver hands a volume the mount reads back."""
    from pffs.csi.server import GROUP_OPTIONS, config_from_args

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    csi_flags = {f: a for a in commands.choices["csi"]._actions for f in a.option_strings}
    mount_flags = mount_actions()
    for option in GROUP_OPTIONS:
        driver, mount = csi_flags[option.flag], mount_flags[option.flag]
        kinds = [getattr(action.type, "__name__", None) for action in (driver, mount)]
        assert driver.metavar == mount.metavar and kinds[0] == kinds[1] == option.parse.__name__
        assert str(driver.help).startswith(str(mount.help))
    assert "dns://NAME:PORT" in str(csi_flags["--group-members"].help)
    given = ["--group-members", "dns://pffs-group.pffs.svc:7070", "--group-secret-file", "/s"]
    given += ["--group-handover", "90", "--group-principal-secret-file", "/p"]
    args = parser.parse_args(["csi", "--endpoint", "unix:///tmp/x.sock", "--node-id", "n", *given])
    handed = config_from_args(args).group_options()
    assert handed == [*given[:2], "--group-listen", "0.0.0.0:7070", *given[2:]]
    mounted = parsed(["mount", "s3://b", "/m", *handed])
    for option in GROUP_OPTIONS:
        assert getattr(mounted, option.dest) == getattr(args, option.dest)
    with pytest.raises(SystemExit):
        parser.parse_args(["csi", "--endpoint", "unix:///x", "--group-members", "dns://x"])


def test_the_csi_drivers_node_flags_reach_every_volume_and_refuse_bad_values() -> None:
    """The node's own mount options (its disk's free-space floor) are the driver's flags,
    parsed by the table's row: handed to every volume's `pffs mount`, a bad value refused when
    the driver starts; without the flag a volume gets the mount's default."""
    from pffs.csi.server import config_from_args

    parser = build_parser()
    driver = ["csi", "--endpoint", "unix:///tmp/x.sock", "--node-id", "n"]
    args = parser.parse_args([*driver, "--cache-free-ratio", "0"])
    handed = config_from_args(args).node_options()
    assert handed == ["--cache-free-ratio", "0"]
    assert parsed(["mount", "s3://b", "/m", *handed]).cache_free_ratio == 0
    assert config_from_args(parser.parse_args(driver)).node_options() == [
        "--cache-free-ratio",
        "0.1",
    ]
    with pytest.raises(SystemExit):
        parser.parse_args([*driver, "--cache-free-ratio", "1.5"])


DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_every_option_is_documented(option: Option) -> None:
    """Each row is on a doc page under its spelling: its flag (a pffs.toml key when it has
    none), and its CSI attribute on the Kubernetes page."""
    pages = "".join(page.read_text() for page in DOCS.glob("*.md"))
    assert (
        (f"`{option.flag} " in pages or f"`{option.flag}`" in pages)
        if option.cli
        else (f"{option.toml} = " in pages)
    )
    if option.csi:
        assert f"`{option.csi}`" in (DOCS / "KUBERNETES.md").read_text()


@pytest.mark.parametrize("text", ["-1", "inf", "soon"])
def test_the_csi_drivers_interval_is_refused_by_its_parser(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parsed(["csi", "--endpoint", "unix:///x", "--publish-interval", text])
    assert f"argument --publish-interval: {text!r} is not a number of seconds" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_a_default_named_in_the_help_is_the_default(option: Option) -> None:
    """`--help` ends a row's text with its default in brackets, "(32M)": it must be the value
    the row really defaults to (the kernel readahead's said 4M after the default became 2M)."""
    named = re.search(r"\(([^()]*)\)$", option.help)
    if named is None or option.default is None or callable(option.default):
        return
    try:
        value = option.parse(named.group(1))
    except BadValue:
        return  # words, not a value: "default: ...", "cluster's"
    assert value == option.default, (named.group(1), option.default)
