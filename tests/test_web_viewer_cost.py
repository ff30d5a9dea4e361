"""The web viewer's cost tool: its interleaved windows' arithmetic on synthetic rates (no viewer runs here)."""
import pytest

from benchmarks.tools.web_viewer_cost import interleaved_ratios


def drifting_windows(true_ratio: dict, bare_at, window_s=3.0, gap_s=0.5, rounds=2):
    """Bare, served, bare, resting, bare, moving, ... then bare; the bare rate follows `bare_at(t)` and each condition
    runs at `true_ratio` times it (a window's rate: the mean over the window, the rate at its midpoint when linear)."""
    windows, t = [], 0.0
    order = [c for _ in range(rounds) for c in ("no_viewer", "served_no_client", "no_viewer", "resting_client",
                                                "no_viewer", "moving_client")] + ["no_viewer"]
    for condition in order:
        mid = t + window_s / 2
        rate = bare_at(mid) * (1.0 if condition == "no_viewer" else true_ratio[condition])
        windows.append({"condition": condition, "start": t, "end": t + window_s, "rate": rate})
        t += window_s + gap_s
    return windows


def test_linear_drift_cancels():
    truth = {"served_no_client": 1.0, "resting_client": 0.93, "moving_client": 0.8}
    windows = drifting_windows(truth, lambda t: 93.0 + 2.5 * t)  # the bare rate more than doubles over the run
    out = interleaved_ratios(windows)
    assert set(out) == set(truth)
    for condition, ratio in truth.items():
        assert out[condition]["ratio"] == pytest.approx(ratio, rel=1e-12)
        assert len(out[condition]["ratios"]) == 2
    # One baseline for the whole run (the mean of the first and last bare windows) is off by the drift for windows
    # away from the run's middle.
    first, last = windows[0]["rate"], windows[-1]["rate"]
    served = [w["rate"] for w in windows if w["condition"] == "served_no_client"]
    assert abs(sum(served) / len(served) / (0.5 * (first + last)) - 1.0) > 0.05


def test_unequal_spacing_interpolates_at_the_window_midpoint():
    windows = [{"condition": "no_viewer", "start": 0.0, "end": 2.0, "rate": 100.0},  # midpoint 1
               {"condition": "resting_client", "start": 2.5, "end": 3.5, "rate": 90.0},  # midpoint 3
               {"condition": "no_viewer", "start": 6.0, "end": 8.0, "rate": 200.0}]  # midpoint 7
    assert interleaved_ratios(windows)["resting_client"]["ratio"] == pytest.approx(90.0 / (100.0 + 100.0 * 2 / 6))


def test_a_condition_after_the_last_bare_window_takes_that_window_alone():
    windows = [{"condition": "no_viewer", "start": 0.0, "end": 1.0, "rate": 50.0},
               {"condition": "moving_client", "start": 1.0, "end": 2.0, "rate": 40.0}]
    assert interleaved_ratios(windows)["moving_client"]["ratios"] == [pytest.approx(0.8)]
    with pytest.raises(ValueError, match="no_viewer"):
        interleaved_ratios(windows[1:])


def test_the_median_ignores_one_window_the_host_slowed():
    truth = {"served_no_client": 1.0, "resting_client": 0.97, "moving_client": 0.95}
    windows = drifting_windows(truth, lambda t: 200.0, rounds=5)
    moving = [w for w in windows if w["condition"] == "moving_client"]
    moving[2]["rate"] *= 0.6  # one window hit by a pause of the host's own
    out = interleaved_ratios(windows)
    assert out["moving_client"]["median"] == pytest.approx(0.95, rel=1e-12)
    assert out["moving_client"]["ratio"] == pytest.approx(0.95 * (1 - 0.4 / 5), rel=1e-12)
    assert out["resting_client"]["median"] == pytest.approx(0.97, rel=1e-12)


def test_conditions_option_is_checked():
    from benchmarks.tools.web_viewer_cost import parse_args

    assert parse_args(["--conditions", "resting_client,moving_client"]).conditions == ["resting_client",
                                                                                      "moving_client"]
    for bad in ("no_viewer", "moving,resting_client", "moving_client,moving_client", ","):
        with pytest.raises(SystemExit):
            parse_args(["--conditions", bad])
