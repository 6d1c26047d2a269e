# agentbox code interpreter: IPython start-up for Python contexts.
#
# Adds two display formats next to IPython's own:
#   e2b/data  - a pandas DataFrame as {column: [values...]}
#   e2b/chart - the data plotted in a matplotlib figure (line, scatter, bar,
#               pie; several axes become a "superchart"), so an agent can read
#               a chart without looking at its PNG.
# Both formatters return None (no output) for anything else and never raise:
# a chart that cannot be read still comes back as an image.

import math as _ab_math
import re as _ab_re
import sys as _ab_sys


def _ab_setup():
    import IPython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    def plain(v):
        """A JSON-safe scalar."""
        try:
            import numpy

            if isinstance(v, numpy.generic):
                v = v.item()
        except ImportError:
            pass
        if isinstance(v, float) and (_ab_math.isnan(v) or _ab_math.isinf(v)):
            return None
        if hasattr(v, "isoformat"):
            return v.isoformat()
        if isinstance(v, (str, int, float, bool)) or v is None:
            return v
        return str(v)

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

        def __call__(self, obj):
            pandas = _ab_sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame):
                return None
            try:
                return {str(k): [plain(v) for v in vals] for k, vals in obj.to_dict(orient="list").items()}
            except Exception:
                return None

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            if _ab_sys.modules.get("matplotlib") is None:
                return None
            from matplotlib.figure import Figure

            if not isinstance(obj, Figure):
                return None
            try:
                return _ab_figure_chart(obj)
            except Exception:
                return {"type": "unknown", "title": None, "elements": []}

    ip = IPython.get_ipython()
    if ip is None:
        return
    f = ip.display_formatter.formatters
    f["e2b/data"] = DataFormatter(parent=ip.display_formatter)
    f["e2b/chart"] = ChartFormatter(parent=ip.display_formatter)


_AB_UNIT = _ab_re.compile(r"[\(\[]\s*([^\(\)\[\]]+?)\s*[\)\]]\s*$")


def _ab_figure_chart(fig):
    axes = [ax for ax in fig.get_axes() if ax.lines or ax.patches or ax.collections]
    if not axes:
        return None
    if len(axes) == 1:
        return _ab_axes_chart(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else None
    return {"type": "superchart", "title": title or None, "elements": [_ab_axes_chart(ax) for ax in axes]}


def _ab_label(text):
    return text if text else None


def _ab_unit(label):
    if not label:
        return None
    m = _AB_UNIT.search(label)
    return m.group(1) if m else None


def _ab_axis(ax, which):
    """Scale, ticks and tick labels of the x or y axis, within the view."""
    import matplotlib.category as mcat
    import matplotlib.dates as mdates

    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(axis.get_view_interval())
    ticks = [t for t in axis.get_ticklocs() if lo - 1e-9 * abs(hi - lo) <= t <= hi + 1e-9 * abs(hi - lo)]
    is_date = isinstance(axis.get_major_locator(), mdates.DateLocator) or isinstance(
        axis.get_major_formatter(), (mdates.DateFormatter, mdates.AutoDateFormatter, mdates.ConciseDateFormatter)
    )
    is_cat = isinstance(getattr(axis, "units", None), mcat.UnitData)
    try:
        labels = [str(s) for s in axis.get_major_formatter().format_ticks(ticks)]
    except Exception:
        labels = [str(t) for t in ticks]
    scale = axis.get_scale()
    if is_date:
        scale = "datetime"
        tick_values = [mdates.num2date(t).isoformat() for t in ticks]
    elif is_cat:
        scale = "categorical"
        tick_values = [float(t) for t in ticks]
    else:
        tick_values = [float(t) for t in ticks]
    return scale, tick_values, labels, is_date, is_cat


def _ab_values(axis_info, values):
    import matplotlib.dates as mdates

    _, _, _, is_date, _ = axis_info
    out = []
    for v in values:
        if is_date:
            try:
                out.append(mdates.num2date(float(v)).isoformat())
                continue
            except Exception:
                pass
        out.append(_ab_scalar(v))
    return out


def _ab_scalar(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if _ab_math.isnan(f) or _ab_math.isinf(f):
        return None
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


def _ab_axes_chart(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    chart = {"title": _ab_label(ax.get_title()), "elements": []}
    xl, yl = ax.get_xlabel(), ax.get_ylabel()
    two_d = {"x_label": _ab_label(xl), "y_label": _ab_label(yl), "x_unit": _ab_unit(xl), "y_unit": _ab_unit(yl)}

    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        chart["type"] = "pie"
        for w in wedges:
            chart["elements"].append(
                {"label": w.get_label(), "angle": _ab_scalar(abs(w.theta2 - w.theta1)), "radius": _ab_scalar(w.r)}
            )
        return chart

    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        chart.update(two_d)
        chart["type"] = "bar"
        for c in bars:
            horizontal = getattr(c, "orientation", "vertical") == "horizontal"
            axis = ax.yaxis if horizontal else ax.xaxis
            locs = list(axis.get_ticklocs())
            try:
                texts = [str(s) for s in axis.get_major_formatter().format_ticks(locs)]
            except Exception:
                texts = [str(t) for t in locs]
            group = c.get_label()
            for rect in c.patches:
                if horizontal:
                    center, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
                else:
                    center, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
                label = None
                for loc, text in zip(locs, texts):
                    if abs(loc - center) < 1e-6 * max(1.0, abs(center)):
                        label = text
                        break
                chart["elements"].append(
                    {"label": label if label is not None else str(_ab_scalar(center)), "value": _ab_scalar(value),
                     "group": group if group and not group.startswith("_") else None}
                )
        return chart

    xinfo, yinfo = _ab_axis(ax, "x"), _ab_axis(ax, "y")
    chart.update(two_d)
    chart.update({
        "x_scale": xinfo[0], "x_ticks": xinfo[1], "x_tick_labels": xinfo[2],
        "y_scale": yinfo[0], "y_ticks": yinfo[1], "y_tick_labels": yinfo[2],
    })
    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    lines = [ln for ln in ax.lines if len(ln.get_xydata()) > 0]
    if points and not lines:
        chart["type"] = "scatter"
        for c in points:
            offs = c.get_offsets()
            xs = _ab_values(xinfo, [o[0] for o in offs])
            ys = _ab_values(yinfo, [o[1] for o in offs])
            chart["elements"].append({"label": c.get_label(), "points": [list(p) for p in zip(xs, ys)]})
        return chart
    if lines:
        chart["type"] = "line"
        for ln in lines:
            xy = ln.get_xydata()
            xs = _ab_values(xinfo, [p[0] for p in xy])
            ys = _ab_values(yinfo, [p[1] for p in xy])
            chart["elements"].append({"label": ln.get_label(), "points": [list(p) for p in zip(xs, ys)]})
        return chart
    chart["type"] = "unknown"
    return chart


def _ab_bound_output():
    """Make print floods leave the kernel in pieces of at most ~1 MiB.

    ipykernel sends stdout/stderr every 0.2 s, as one message however much
    was written meanwhile: a loop printing 100 MB becomes one 100 MB message
    the server has to hold in memory. Flushing once the buffer holds 1 MiB
    bounds the messages, and since flush waits for the send, a slow reader
    slows the printing code down instead of filling memory.
    """
    from ipykernel.iostream import OutStream

    if getattr(OutStream.write, "_ab_bounded", False):
        return
    write = OutStream.write

    def bounded_write(self, string):
        n = write(self, string)
        try:
            if self._buffer.tell() >= 1 << 20 and self._is_master_process():
                self.flush()
        except Exception:
            pass
        return n

    bounded_write._ab_bounded = True
    OutStream.write = bounded_write


try:
    _ab_bound_output()
except Exception as _ab_err:
    print("agentbox: output bounding unavailable:", _ab_err, file=_ab_sys.stderr)

try:
    _ab_setup()
except Exception as _ab_err:  # never break the kernel over output formats
    print("agentbox: chart/data formatters unavailable:", _ab_err, file=_ab_sys.stderr)
del _ab_setup, _ab_bound_output
