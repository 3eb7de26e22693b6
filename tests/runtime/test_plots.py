"""The reports' plots: what each curve is computed from, resumes marked where they happened,
and legends that hide no curve and no bar."""

from __future__ import annotations

import pytest

from invar.runtime.plots import Curves, learner_figure, throughput_figure, throughput_points


def _rows(n: int, period: float = 0.5, **extra: float) -> list[dict]:
    return [{"update": u, "reward": 0.1, "wall": period * (u + 1), **extra} for u in range(n)]


def test_throughput_is_a_rolling_rate_over_the_rows_walls():
    run = Curves("run", _rows(30), [])
    walls, rates = throughput_points(run, window=10)
    assert walls[0] == 0.5 and walls[-1] == 15.0
    assert rates == pytest.approx([2.0] * 30)
    slow = Curves("run", [*_rows(10), *({"update": 10 + u, "reward": 0.1, "wall": 5.0 + u + 1}
                                        for u in range(10))], [])
    _, rates = throughput_points(slow, window=10)
    assert rates[9] == pytest.approx(2.0) and rates[-1] == pytest.approx(1.0)


def test_resumes_are_placed_at_the_updates_recorded_before_them():
    run = Curves("run", _rows(20), [], resumes=[3.2, 7.0])
    assert run.resumed_at_updates() == [6, 14]


def test_learner_panels_are_those_some_run_logs():
    assert learner_figure([Curves("run", _rows(5), [])]) is None
    logged = Curves("a", _rows(5, loss=0.1, kl=0.0, clip_fraction=0.1, entropy=2.0), [])
    lengths = Curves("b", _rows(5, response_length_mean=12.0, response_truncated_share=0.2), [])
    figure, axes = learner_figure([logged, lengths])
    assert [axis.get_title() for axis in axes] == [
        "loss", "KL to the reference (k3; 0 when kl_coef = 0)", "clip fraction",
        "entropy of sampled tokens (nats/token)", "mean response length (tokens)",
        "responses cut at response_length"]
    _assert_legend_clear(figure, axes)


def _assert_legend_clear(figure, axes) -> None:  # noqa: ANN001
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    legend = figure.legends[0].get_window_extent(renderer)
    for axis in axes:
        assert not legend.overlaps(axis.get_window_extent(renderer))


def test_three_runs_legends_fit_inside_their_figures():
    """Long labels, several runs: the legend takes fewer columns, and is never cut off."""
    from invar.runtime.plots import reward_figure
    evaluations = [{"version": v, "heldout_reward": 0.1, "wall": 0.5 * v} for v in (0, 5, 10)]
    runs = [Curves(f"smollm2-{name}-seed0", _rows(12, response_truncated_share=0.5),
                   evaluations, resumes=[2.0]) for name in ("S0", "S1", "trl")]
    reward, axis = reward_figure(runs, "update", threshold=0.8)
    learner, axes = learner_figure(runs)
    for figure, shown in ((reward, [axis]), (learner, axes)):
        figure.canvas.draw()
        inside = figure.legends[0].get_window_extent(figure.canvas.get_renderer())
        assert inside.x0 >= 0 and inside.x1 <= figure.bbox.width, (inside, figure.bbox)
        assert inside.y0 >= 0
        _assert_legend_clear(figure, shown)
    assert len(reward.legends[0].get_texts()) == 10  # 3 x (train, held-out, resumed) + 1


def test_the_throughput_plot_marks_resumes_and_its_legend_covers_no_curve():
    figure, axis = throughput_figure([Curves("a", _rows(30), [], resumes=[6.0]),
                                      Curves("b", _rows(20, period=1.0), [])])
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["a", "a: resumed", "b"]
    _assert_legend_clear(figure, [axis])
