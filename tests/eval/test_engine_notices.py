"""Engine notices only when they apply (issue 40): the CPU build's expand-kernel fix touches
sampling at temperature > 0 only, so a greedy figure neither says nor records it; the DFlash
rms_norm fix changes greedy figures too, so it is said at any temperature."""

from specdraft.eval.engine import FIX_NAMES, figure_fixes
from specdraft.eval.engine_worker import CPU_EXPAND_FIX, CPU_GROUPED_RMS_NORM_FIX


def test_the_expand_fix_only_at_temperature_above_zero():
    both = [CPU_EXPAND_FIX, CPU_GROUPED_RMS_NORM_FIX]
    assert figure_fixes(both, 0.0) == [CPU_GROUPED_RMS_NORM_FIX]
    assert figure_fixes([CPU_EXPAND_FIX], 0.0) == []
    assert figure_fixes(both, 0.7) == both
    assert figure_fixes([], 1.0) == []


def test_the_notice_is_short():
    for fix in (CPU_EXPAND_FIX, CPU_GROUPED_RMS_NORM_FIX):
        assert len(FIX_NAMES[fix]) < 100 < len(fix)
