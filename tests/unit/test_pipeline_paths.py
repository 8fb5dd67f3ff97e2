"""The route the api tries first for ingest (routes/ingest.py PipelinePath) takes exactly the paths
a pipeline may have that are not Calve's own, so that it never shadows one of Calve's routes."""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.api.main import create_app
from service.api.routes.ingest import PipelinePath
from service.core.config import Settings
from service.pipelines.spec import PATH_PATTERN, RESERVED_PATH_PREFIXES, is_reserved_path

FIRST = re.compile("/" + PipelinePath.regex)
segments = st.one_of(st.text("ab0_-.Z/", min_size=0, max_size=6), st.sampled_from([p.lstrip("/") for p in RESERVED_PATH_PREFIXES]),
                     st.sampled_from(["_bulk", "_doc", "_create", "docsx", "v10", "logs", "otlp_events"]))
paths = st.lists(segments, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))


@settings(max_examples=1500, deadline=None)
@given(paths)
@example("/logs")
@example("/docs")
@example("/docsx")
@example("/v1")
@example("/v1/x")
@example("/shop/_doc")
@example("/shop/_doc/1")
@example("/shop/_docs")
@example("/a/b/_bulk")
@example("/_bulk")
@example("/loki/api/v1/push")
@example("/otlp_events")
@example("/")
def test_the_first_ingest_route_takes_the_paths_a_pipeline_may_have_that_are_not_calves_own(path: str) -> None:
    assert bool(FIRST.fullmatch(path)) == bool(PATH_PATTERN.fullmatch(path) and not is_reserved_path(path))


def test_no_route_of_calves_own_is_taken_by_the_first_ingest_route(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("CALVE_DATA_DIR", str(tmp_path))
    documented = create_app(Settings()).openapi()["paths"]
    own = [path for path in documented if path != "/{path}"]
    assert len(own) > 30, "the api's documented routes"
    for path in own:
        for value in ("x", "abc", "a-b"):
            concrete = re.sub(r"\{[^}]+\}", value, path)
            assert not FIRST.fullmatch(concrete), f"{concrete} (route {path}) would be taken as a pipeline's path"
