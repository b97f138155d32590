"""The data-flow picture of docs/architecture.md names functions that exist, and draws every node it lists."""

import pytest

from alfa.study.dataflow import FLOWS, NODES, PACKAGES, Flow, mermaid, resolve


@pytest.mark.parametrize("flow", FLOWS, ids=[f.function for f in FLOWS])
def test_every_step_names_a_function_that_exists(flow):
    assert callable(resolve(flow.function))


def test_every_node_is_placed_once_and_every_step_joins_known_nodes():
    ids = [n.id for n in NODES]
    assert len(ids) == len(set(ids)) and all(n.package in PACKAGES for n in NODES)
    used = {n for f in FLOWS for n in (*f.sources, f.target)}
    assert used == set(ids)  # no step names an unknown node, and no node is left without a step


def test_the_picture_has_one_arrow_per_source_of_each_step():
    text = mermaid()
    assert text.startswith("```mermaid\nflowchart TD\n")
    arrows = [line for line in text.splitlines() if " --> " in line]
    assert len(arrows) == sum(len(f.sources) for f in FLOWS)
    assert "    dense -- truncate_and_recover --> base" in arrows
    # user calibration: labelled images of the dataset, on a dense, truncated or FAZE model, give adapters
    calibrate = {line.split(" -- ")[0].strip() for line in arrows if "-- calibrate_dataset --> adapters" in line}
    assert calibrate == {"dataset", "dense", "base", "adagen"}


def test_a_wrong_name_fails_to_resolve():
    with pytest.raises(AttributeError):
        resolve("alfa.gaze.train.no_such_function")
    with pytest.raises(ImportError):
        resolve("nowhere.at_all")
    assert mermaid(NODES, (Flow(("spec",), "dataset", "x.load"),)).count(" --> ") == 1
