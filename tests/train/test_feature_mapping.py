"""How a config's table features meet the data's sparse columns (neo.train.data): by name, by
position when no name matches, a ConfigError for a partial match or for ids past a table's rows."""

from __future__ import annotations

import pytest

from neo.config import ConfigError
from neo.config.embedding import TableConfig
from neo.train.data import check_table_sizes, feature_mapping

CRITEO = ["cat_0", "cat_1", "cat_2", "cat_3"]


def test_by_name_when_every_feature_is_in_the_data():
    tables = [TableConfig("a", 10, 4, feature_names=("cat_2", "cat_0")), TableConfig("b", 10, 4, feature_names=("cat_3", "cat_1"))]
    assert feature_mapping(CRITEO, tables) is None


def test_by_position_when_no_feature_is_in_the_data():
    tables = [TableConfig(f"t{k}", 10, 4) for k in range(4)]               # features t0 .. t3
    assert feature_mapping(CRITEO, tables) == {"cat_0": "t0", "cat_1": "t1", "cat_2": "t2", "cat_3": "t3"}


def test_a_partial_match_is_refused_naming_the_missing_features():
    # found by the audit of 2026-11-29: cat_3 .. cat_1 were matched by position, the table of
    # feature cat_3 then read column cat_0
    tables = [TableConfig("t0", 10, 8, feature_names=("cat_3",)), TableConfig("t1", 10, 8, feature_names=("cat_2",)),
              TableConfig("t2", 10, 8, feature_names=("cat_1",)), TableConfig("t3", 10, 8, feature_names=("clicks",))]
    with pytest.raises(ConfigError, match=r"clicks \(table 't3'\).*not among.*\['cat_3', 'cat_2', 'cat_1'\] are"):
        feature_mapping(CRITEO, tables)


def test_by_position_needs_equal_counts():
    with pytest.raises(ConfigError, match="counts differ"):
        feature_mapping(CRITEO, [TableConfig("t0", 10, 4)])


def test_table_sizes_past_a_tables_rows_are_refused_before_training():
    tables = [TableConfig(f"t{k}", 1000, 4, feature_names=(f"cat_{k}",)) for k in range(3)] + \
        [TableConfig("t3", 400, 4, feature_names=("cat_3",))]
    check_table_sizes(CRITEO, [1000, 10, 1000, 400], tables, "meta")          # fits: nothing raised
    check_table_sizes(CRITEO, None, tables, "meta")                           # unknown sizes: nothing to check
    with pytest.raises(ConfigError, match=r"table 't3': num_rows = 400.*feature 3 \(cat_3\) has ids up to 999"):
        check_table_sizes(CRITEO, [1000, 1000, 1000, 1000], tables, "meta")
    by_position = [TableConfig(f"t{k}", 1000, 4) for k in range(3)] + [TableConfig("t3", 400, 4)]
    with pytest.raises(ConfigError, match=r"table 't3'"):
        check_table_sizes(CRITEO, [1000, 1000, 1000, 401], by_position, "meta")
