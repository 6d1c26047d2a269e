# agentbox code interpreter: IPython start-up for Python contexts.
#
# Adds two display formats next to IPython's own:
#   e2b/data  - a pandas DataFrame as {column: [values...]}
#   e2b/chart - the data plotted in a matplotlib figure, in the shapes E2B's
#               code interpreter reports (line, scatter, bar, pie,
#               box_and_whisker, unknown; several axes become a "superchart";
#               numbers are floats, rounded where E2B rounds), so an agent
#               can read a chart without looking at its PNG.
# A dict or list value also comes as application/json, as in E2B, and PIL's
# Image.save(filename) displays the image, as E2B's template makes it do.
# Both formatters return None (no output) for anything else and never raise:
# a chart that cannot be read still comes back as an image.

import json as _ab_json
import math as _ab_math
import re as _ab_re
import sys as _ab_sys


def _ab_setup():
    import IPython
    from IPython.core.formatters import BaseFormatter
    from IPython.core.formatters import JSONFormatter as IPythonJSONFormatter
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

    class JSONFormatter(IPythonJSONFormatter):
        """As in E2B: a dict or list value also comes as JSON (numpy values
        as numbers and lists, other keys as strings), when it has a JSON
        form; IPython's own formatter gives it none."""

        def __call__(self, obj):
            if isinstance(obj, (dict, list)):
                try:
                    return _ab_json.loads(_ab_json.dumps(_ab_jsonable(obj), allow_nan=False)), {"expanded": True}
                except (TypeError, ValueError, RecursionError):
                    pass
            return super().__call__(obj)

    ip = IPython.get_ipython()
    if ip is None:
        return
    f = ip.display_formatter.formatters
    f["e2b/data"] = DataFormatter(parent=ip.display_formatter)
    f["e2b/chart"] = ChartFormatter(parent=ip.display_formatter)
    f["application/json"] = JSONFormatter(parent=ip.display_formatter)


# A unit is the text in parentheses after a space, or in brackets, as in
# "Time (s)" or "Price [USD]": what E2B's extractor reports.
_AB_UNIT = _ab_re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _ab_dec(v):
    """Round like E2B's extractor: about 8 significant digits less one per
    power of ten (so 90.00000000001 becomes 90). A Decimal, so sums and
    differences of rounded values compare exactly."""
    import decimal

    d = v if isinstance(v, decimal.Decimal) else decimal.Decimal(str(v))
    if not d.is_finite():
        return d
    with decimal.localcontext() as ctx:
        ctx.prec = max(1, 8 - d.adjusted())
        return +d


def _ab_json_safe(v):
    """NaN and infinities are not JSON: they become null."""
    if isinstance(v, float) and (_ab_math.isnan(v) or _ab_math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {k: _ab_json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_ab_json_safe(x) for x in v]
    return v


def _ab_jsonable(v):
    """v with numpy values made plain and dict keys made strings; anything
    else without a JSON form raises TypeError (in json.dumps)."""
    if isinstance(v, dict):
        return {k if isinstance(k, str) else str(k): _ab_jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_ab_jsonable(x) for x in v]
    np = _ab_sys.modules.get("numpy")
    if np is not None and isinstance(v, (np.generic, np.ndarray)):
        return _ab_jsonable(v.tolist())
    return v


def _ab_figure_chart(fig):
    """The chart of a figure in the shapes E2B's code interpreter reports:
    None for a blank figure, a "superchart" for several axes."""
    axes = fig.get_axes()
    if not axes or not any(ax.has_data() for ax in axes):
        return None
    if len(axes) == 1:
        return _ab_json_safe(_ab_axes_chart(axes[0]))
    st = getattr(fig, "_suptitle", None)
    return _ab_json_safe({
        "type": "superchart",
        "title": st.get_text() if st is not None else "",
        "elements": [_ab_axes_chart(ax) for ax in axes],
    })


def _ab_is_grid_line(line):
    xs, ys = line.get_xdata(), line.get_ydata()
    return len(xs) == 2 and len(ys) == 2 and (xs[0] == xs[1] or ys[0] == ys[1])


def _ab_chart_type(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text

    objs = [o for o in getattr(ax, "_children", ax.get_children()) if not isinstance(o, Text)]
    if all(isinstance(o, Line2D) for o in objs):
        return "line"
    if all(isinstance(o, (PathPatch, Line2D)) for o in objs):
        return "box_and_whisker"
    objs = [o for o in objs if not (isinstance(o, Line2D) and _ab_is_grid_line(o))]
    for kind, cls in (("scatter", PathCollection), ("pie", Wedge), ("bar", Rectangle)):
        if all(isinstance(o, cls) for o in objs):
            return kind
    return "unknown"


def _ab_axes_chart(ax):
    kind = _ab_chart_type(ax)
    title = ax.get_title() or None
    if kind == "unknown":
        return {"type": "unknown", "title": title, "elements": []}
    if kind == "pie":
        return {"type": "pie", "title": title, "elements": _ab_pie(ax)}
    chart = {"type": kind, "title": title, "elements": []}
    xl, yl = ax.get_xlabel() or None, ax.get_ylabel() or None
    chart.update({"x_label": xl, "y_label": yl, "x_unit": _ab_unit(xl), "y_unit": _ab_unit(yl)})
    if kind == "bar":
        _ab_bars(ax, chart)
    elif kind == "box_and_whisker":
        _ab_boxes(ax, chart)
    else:
        _ab_points(ax, chart, kind)
    return chart


def _ab_unit(label):
    m = _AB_UNIT.search(label) if label else None
    return (m.group(1) or m.group(2)) if m else None


def _ab_swap_axes(chart):
    for a, b in (("x_label", "y_label"), ("x_unit", "y_unit")):
        chart[a], chart[b] = chart[b], chart[a]


def _ab_pie(ax):
    import decimal

    out = []
    for w in ax.patches:
        angle = decimal.Decimal(float(w.theta2)) - decimal.Decimal(float(w.theta1))
        out.append({"label": str(w.get_label()), "angle": float(abs(_ab_dec(angle))), "radius": float(w.r)})
    return out


def _ab_bars(ax, chart):
    swapped = False
    for c in ax.containers:
        group = str(c.get_label())
        if group.startswith("_container"):
            group = "Group " + group[len("_container"):]
        rects = list(c)
        orientation = getattr(c, "orientation", None)
        if orientation is None:  # E2B's guess: equal heights are horizontal bars
            hs = [r.get_height() for r in rects]
            orientation = "horizontal" if all(h == hs[0] for h in hs) else "vertical"
        if orientation == "horizontal":
            # The categories are on the y axis: report them as the x axis.
            if not swapped:
                _ab_swap_axes(chart)
                swapped = True
            labels = [t.get_text() for t in ax.get_yticklabels()]
            values = [r.get_width() for r in rects]
        else:
            labels = [t.get_text() for t in ax.get_xticklabels()]
            values = [r.get_height() for r in rects]
        for label, value in zip(labels, values):
            chart["elements"].append({"label": label, "group": group, "value": float(value)})


def _ab_boxes(ax, chart):
    """Box plots drawn with patches (patch_artist=True, seaborn): each box's
    quartiles from its patch, median, whiskers and outliers from the lines
    inside its span."""
    from matplotlib.patches import PathPatch

    patches = [p for p in ax.patches if isinstance(p, PathPatch)]
    boxes = []
    for patch in patches:
        v = patch.get_path().vertices
        xs, ys = [_ab_dec(x) for x in v[:, 0]], [_ab_dec(y) for y in v[:, 1]]
        boxes.append({"pos": (min(xs), max(xs)), "val": (min(ys), max(ys))})
    if not boxes:
        return
    # Equal heights mean boxes lying along the x axis (vert=False).
    horizontal = all(b["val"][1] - b["val"][0] == boxes[0]["val"][1] - boxes[0]["val"][0] for b in boxes)
    ticklabels = ax.get_yticklabels() if horizontal else ax.get_xticklabels()
    boxes = [dict(b, label=t.get_text()) for t, b in zip(ticklabels, boxes)]
    if horizontal:
        _ab_swap_axes(chart)
        for b in boxes:
            b["pos"], b["val"] = b["val"], b["pos"]
    for b in boxes:
        b.update({"min": b["val"][0], "median": None, "max": b["val"][1], "outliers": []})
    for line in ax.lines:
        pos = [_ab_dec(x) for x in line.get_xdata()]
        val = [_ab_dec(y) for y in line.get_ydata()]
        if horizontal:
            pos, val = val, pos
        if not pos:
            continue
        box = next((b for b in boxes if b["pos"][0] <= min(pos) and max(pos) <= b["pos"][1]), None)
        if box is None:
            continue
        lo, hi = box["val"]
        if str(line.get_linestyle()).lower() in ("none", "", " "):
            box["outliers"].extend(val)  # fliers: markers only
        elif len(val) == 2 and val[0] == val[1] and lo <= val[0] <= hi:
            box["median"] = val[0]
        elif len(val) == 2 and max(val) == lo:
            box["min"] = min(val)
        elif len(val) == 2 and min(val) == hi:
            box["max"] = max(val)
    for b in boxes:
        lo, hi = b["val"]
        chart["elements"].append({
            "label": b["label"], "min": float(b["min"]), "first_quartile": float(lo),
            "median": float(b["median"] if b["median"] is not None else (lo + hi) / 2),
            "third_quartile": float(hi), "max": float(b["max"]), "outliers": [float(o) for o in b["outliers"]],
        })


def _ab_axis_info(ax, which):
    """Ticks, tick labels and scale of the x or y axis."""
    import matplotlib.dates as mdates

    axis = ax.xaxis if which == "x" else ax.yaxis
    ticks = list(axis.get_ticklocs())
    labels = [t.get_text() for t in axis.get_ticklabels()]
    is_date = isinstance(getattr(axis, "converter", None), getattr(mdates, "_SwitchableDateConverter", mdates.DateConverter))
    if is_date:
        return [mdates.num2date(t).isoformat() for t in ticks], labels, "datetime"
    ticks = [float(t) for t in ticks]
    scale = axis.get_scale()
    if scale == "linear" and all(t == i and str(i) != lab for i, (t, lab) in enumerate(zip(ticks, labels))):
        # Ticks 0..n-1 labelled with something else than their numbers.
        scale = "categorical"
    return ticks, labels, scale


def _ab_point(v):
    import datetime

    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    np = _ab_sys.modules.get("numpy")
    if np is not None and isinstance(v, np.datetime64):
        return str(v.astype("datetime64[s]"))
    if isinstance(v, str):
        return v
    if np is not None and isinstance(v, np.str_):
        return str(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def _ab_points(ax, chart, kind):
    for which in ("x", "y"):
        ticks, labels, scale = _ab_axis_info(ax, which)
        chart[which + "_ticks"], chart[which + "_tick_labels"], chart[which + "_scale"] = ticks, labels, scale
    if kind == "line":
        for line in ax.get_lines():
            if _ab_is_grid_line(line):
                continue
            label = str(line.get_label())
            if label.startswith("_child"):
                label = "Line " + label[len("_child"):]
            pts = [[_ab_point(x), _ab_point(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]
            chart["elements"].append({"label": label, "points": pts})
    else:
        for c in ax.collections:
            pts = [[_ab_point(x), _ab_point(y)] for x, y in c.get_offsets()]
            chart["elements"].append({"label": str(c.get_label()), "points": pts})


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


def _ab_patch_pil():
    """As in E2B's code interpreter: saving a PIL image to a file name also
    displays it (a PNG result, not the cell's main result), and show() does
    not try to open a viewer, which a sandbox has not."""
    from IPython.display import display
    from PIL import Image, ImageShow

    if getattr(Image.Image.save, "_ab_displays", False):
        return
    save = Image.Image.save

    def save_and_display(self, fp, format=None, **params):
        if isinstance(fp, str):
            display(self)
        return save(self, fp, format, **params)

    save_and_display._ab_displays = True
    Image.Image.save = save_and_display
    ImageShow.UnixViewer.show_file = lambda self, path, **options: 0


try:
    _ab_patch_pil()
except ImportError:
    pass  # no PIL in this Python
except Exception as _ab_err:
    print("agentbox: PIL display unavailable:", _ab_err, file=_ab_sys.stderr)

try:
    _ab_bound_output()
except Exception as _ab_err:
    print("agentbox: output bounding unavailable:", _ab_err, file=_ab_sys.stderr)

try:
    _ab_setup()
except Exception as _ab_err:  # never break the kernel over output formats
    print("agentbox: chart/data formatters unavailable:", _ab_err, file=_ab_sys.stderr)
del _ab_setup, _ab_bound_output, _ab_patch_pil
