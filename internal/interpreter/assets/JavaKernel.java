// agentbox code interpreter: the Java kernel, on the JDK's jshell API.
//
// Cells run in one JShell whose snippets (variables, methods, classes,
// imports) persist across cells. A cell is split into snippets the way the
// jshell tool splits input; the value of a final expression is the cell's
// result. It speaks the Node kernel's protocol (see node_kernel.js):
//   stdin, one JSON object per line: {"id": N, "code": "..."} runs a cell,
//     {"interrupt": N} stops cell N
//   fd 3, one JSON object per line: {"type": "ready"} once, then per cell
//     stdout/stderr/result/error events and a final {"id": N, "type": "done"}
// Code runs in this JVM (jshell's "local" engine): one JVM per context, and
// System.out/err are replaced by streams that send events.

import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.LinkedBlockingQueue;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;

public class JavaKernel {
    private static final int MAX_TEXT = 1 << 20;
    private static OutputStream events;
    private static volatile long current; // the running cell's id
    private static volatile long stopped; // the cell last interrupted
    private static volatile long finished; // the cell last ended
    private static final Object STOP_LOCK = new Object();

    // The jshell tool's default imports, which the API does not add.
    private static final String[] IMPORTS = {
        "java.io.*", "java.math.*", "java.net.*", "java.nio.file.*", "java.util.*",
        "java.util.concurrent.*", "java.util.function.*", "java.util.regex.*", "java.util.stream.*",
    };

    public static void main(String[] args) throws Exception {
        events = new FileOutputStream("/proc/self/fd/3");
        // Requests come on stdin: code reading System.in must not eat them.
        InputStream requests = System.in;
        System.setIn(new ByteArrayInputStream(new byte[0]));
        System.setOut(new LinePrintStream(new EventStream("stdout")));
        System.setErr(new LinePrintStream(new EventStream("stderr")));
        JShell shell = JShell.builder().executionEngine("local").build();
        for (String imp : IMPORTS) {
            shell.eval("import " + imp + ";");
        }
        LinkedBlockingQueue<Map<String, Object>> cells = new LinkedBlockingQueue<>();
        Thread reader = new Thread(() -> readRequests(requests, shell, cells), "requests");
        reader.setDaemon(true);
        reader.start();
        send(Map.of("type", "ready"));
        while (true) {
            Map<String, Object> req = cells.take();
            if (req.isEmpty()) {
                System.exit(0); // stdin closed: the server is gone
            }
            long id = ((Number) req.get("id")).longValue();
            current = id;
            try {
                runCell(shell, id, (String) req.get("code"));
            } catch (Throwable t) {
                sendError(id, t.getClass().getName(), String.valueOf(t.getMessage()), stackTrace(t));
            }
            synchronized (STOP_LOCK) {
                finished = id; // no stop may reach the next cell
            }
            System.out.flush();
            System.err.flush();
            send(Map.of("id", id, "type", "done"));
        }
    }

    // readRequests queues cells and handles interrupts at once: a cell
    // that runs cannot read them itself.
    private static void readRequests(InputStream requests, JShell shell, LinkedBlockingQueue<Map<String, Object>> cells) {
        try (BufferedReader in = new BufferedReader(new InputStreamReader(requests, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                Map<String, Object> req = Json.parseObject(line);
                Object intr = req.get("interrupt");
                if (intr != null) {
                    long id = ((Number) intr).longValue();
                    if (id == current && stopped != id) {
                        stopped = id;
                        keepStopping(shell, id);
                    }
                    continue;
                }
                cells.add(req);
            }
        } catch (Exception e) {
            // fall through: treat as closed
        }
        cells.add(Map.of());
    }

    // keepStopping stops cell id until it has ended: JShell.stop does
    // nothing while a snippet compiles or between snippets, so one stop
    // can miss the snippet that then loops.
    private static void keepStopping(JShell shell, long id) {
        Thread t = new Thread(() -> {
            while (true) {
                synchronized (STOP_LOCK) {
                    if (finished == id) {
                        return;
                    }
                    shell.stop();
                }
                try {
                    Thread.sleep(100);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "interrupt");
        t.setDaemon(true);
        t.start();
    }

    private static void runCell(JShell shell, long id, String code) {
        SourceCodeAnalysis sca = shell.sourceCodeAnalysis();
        String rest = code;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
            if (ci.completeness() == SourceCodeAnalysis.Completeness.DEFINITELY_INCOMPLETE) {
                sendError(id, "IncompleteSourceException", "Incomplete input", "Incomplete input:\n" + rest.strip());
                return;
            }
            String src = ci.source();
            if (src == null || src.isBlank() || !ci.completeness().isComplete()) {
                // Incomplete or unparsable: let the compiler say why.
                src = rest;
                rest = "";
            } else {
                rest = ci.remaining();
            }
            if (stopped == id) {
                sendError(id, "EvaluationInterruptedException", "Evaluation interrupted.", src.strip() + "\nEvaluation interrupted.");
                return;
            }
            List<SnippetEvent> evs = shell.eval(src);
            if (stopped == id) {
                // jshell reports a stopped snippet as if it had ended.
                sendError(id, "EvaluationInterruptedException", "Evaluation interrupted.", src.strip() + "\nEvaluation interrupted.");
                return;
            }
            boolean last = rest.isBlank();
            for (SnippetEvent ev : evs) {
                if (ev.causeSnippet() != null) {
                    continue; // an update of a dependent snippet
                }
                if (!report(shell, id, ev, last)) {
                    return; // the first error ends the cell, as in a notebook
                }
            }
        }
    }

    // report sends an event's error or value; false after an error.
    private static boolean report(JShell shell, long id, SnippetEvent ev, boolean last) {
        Snippet sn = ev.snippet();
        if (ev.status() == Snippet.Status.REJECTED) {
            List<String> msgs = new ArrayList<>();
            StringBuilder trace = new StringBuilder();
            shell.diagnostics(sn).forEach(d -> {
                String m = d.getMessage(null);
                msgs.add(m);
                trace.append(describe(sn.source(), d, m));
            });
            if (msgs.isEmpty()) {
                msgs.add("the code could not be compiled");
            }
            sendError(id, "CompilationException", String.join("\n", msgs), trace.toString().stripTrailing());
            return false;
        }
        // Error names are those of IJava, E2B's Java kernel: EvalException
        // for what the code threw (its class leads the traceback),
        // CompilationException, UnresolvedReferenceException,
        // IncompleteSourceException, EvaluationInterruptedException.
        JShellException ex = ev.exception();
        if (ex instanceof EvalException) {
            EvalException ee = (EvalException) ex;
            String cls = ee.getExceptionClassName();
            String msg = ee.getMessage() == null ? "" : ee.getMessage();
            sendError(id, "EvalException", msg, cls + (msg.isEmpty() ? "" : ": " + msg) + "\n" + frames(ee));
            return false;
        }
        if (ex instanceof UnresolvedReferenceException) {
            UnresolvedReferenceException ue = (UnresolvedReferenceException) ex;
            String msg = "Attempt to use definition snippet with unresolved references: "
                    + String.join(", ", shell.unresolvedDependencies(ue.getSnippet()).toList());
            sendError(id, "UnresolvedReferenceException", msg, msg);
            return false;
        }
        if (ex != null) {
            sendError(id, ex.getClass().getName(), String.valueOf(ex.getMessage()), stackTrace(ex));
            return false;
        }
        if (last && ev.value() != null && isExpression(sn)) {
            System.out.flush();
            System.err.flush();
            Map<String, Object> data = new HashMap<>();
            data.put("text/plain", display(sn, ev.value()));
            Map<String, Object> res = new HashMap<>();
            res.put("id", id);
            res.put("type", "result");
            res.put("main", true);
            res.put("data", data);
            send(res);
        }
        return true;
    }

    // An expression's value is shown; a declaration's (int x = 1) is not.
    private static boolean isExpression(Snippet sn) {
        if (sn.kind() == Snippet.Kind.EXPRESSION) {
            return true;
        }
        return sn.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND
                && !"void".equals(((VarSnippet) sn).typeName());
    }

    // display is what a value looks like: a String as its text, as a
    // Jupyter Java kernel shows it, not jshell's quoted literal.
    private static String display(Snippet sn, String value) {
        String type = sn instanceof VarSnippet ? ((VarSnippet) sn).typeName() : "";
        if (("String".equals(type) || "java.lang.String".equals(type))
                && value.length() >= 2 && value.startsWith("\"") && value.endsWith("\"")) {
            return unescape(value.substring(1, value.length() - 1));
        }
        return value;
    }

    private static String unescape(String s) {
        StringBuilder b = new StringBuilder();
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c != '\\' || i + 1 == s.length()) {
                b.append(c);
                continue;
            }
            char n = s.charAt(++i);
            switch (n) {
                case 'n': b.append('\n'); break;
                case 't': b.append('\t'); break;
                case 'r': b.append('\r'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case '0': b.append('\0'); break;
                default: b.append(n);
            }
        }
        return b.toString();
    }

    private static String describe(String src, Diag d, String msg) {
        StringBuilder b = new StringBuilder(msg).append('\n');
        long pos = d.getPosition();
        if (pos >= 0 && pos <= src.length()) {
            int start = src.lastIndexOf('\n', (int) Math.max(0, pos - 1)) + 1;
            int end = src.indexOf('\n', (int) pos);
            String line = src.substring(start, end < 0 ? src.length() : end);
            b.append(line).append('\n').append(" ".repeat((int) pos - start)).append("^\n");
        }
        return b.toString();
    }

    private static String frames(Throwable t) {
        StringBuilder b = new StringBuilder();
        for (StackTraceElement f : t.getStackTrace()) {
            b.append("\tat ").append(f).append('\n');
        }
        return b.toString().stripTrailing();
    }

    private static String stackTrace(Throwable t) {
        return t + "\n" + frames(t);
    }

    private static void sendError(long id, String name, String value, String trace) {
        System.out.flush();
        System.err.flush();
        Map<String, Object> ev = new HashMap<>();
        ev.put("id", id);
        ev.put("type", "error");
        ev.put("ename", name);
        ev.put("evalue", value);
        ev.put("traceback", trace);
        send(ev);
    }

    private static synchronized void send(Map<String, Object> ev) {
        try {
            events.write((Json.write(ev) + "\n").getBytes(StandardCharsets.UTF_8));
            events.flush();
        } catch (Exception e) {
            Runtime.getRuntime().halt(1); // the server is gone
        }
    }

    // LinePrintStream writes a println's text and its line separator as
    // two writes (a PrintStream subclass prints, then ends the line), so
    // EventStream can send them as two chunks: E2B's Java kernel logs
    // System.out.println("x") as "x" then "\n".
    private static final class LinePrintStream extends PrintStream {
        LinePrintStream(OutputStream out) {
            super(out, true, StandardCharsets.UTF_8);
        }
    }

    // EventStream turns what the code prints into stdout/stderr events,
    // sent at each flush (PrintStream flushes on newlines) or when large.
    // A line separator written on its own ends the chunk before it.
    private static final class EventStream extends OutputStream {
        private final String type;
        private final ByteArrayOutputStream buf = new ByteArrayOutputStream();

        EventStream(String type) {
            this.type = type;
        }

        @Override
        public synchronized void write(int b) {
            buf.write(b);
            if (buf.size() >= MAX_TEXT) {
                flush();
            }
        }

        @Override
        public synchronized void write(byte[] b, int off, int len) {
            if (isLineSeparator(b, off, len)) {
                flush();
            }
            buf.write(b, off, len);
            if (buf.size() >= MAX_TEXT) {
                flush();
            }
        }

        private static boolean isLineSeparator(byte[] b, int off, int len) {
            byte[] sep = System.lineSeparator().getBytes(StandardCharsets.UTF_8);
            return Arrays.equals(b, off, off + len, sep, 0, sep.length);
        }

        @Override
        public synchronized void flush() {
            if (buf.size() == 0) {
                return;
            }
            String text = buf.toString(StandardCharsets.UTF_8);
            buf.reset();
            Map<String, Object> ev = new HashMap<>();
            ev.put("id", current);
            ev.put("type", type);
            ev.put("text", text);
            send(ev);
        }
    }

    // Json is just enough JSON: flat request objects in, events out.
    static final class Json {
        static Map<String, Object> parseObject(String s) {
            Json p = new Json(s);
            Object v = p.value();
            if (!(v instanceof Map)) {
                throw new IllegalArgumentException("not a JSON object");
            }
            @SuppressWarnings("unchecked")
            Map<String, Object> m = (Map<String, Object>) v;
            return m;
        }

        private final String s;
        private int i;

        private Json(String s) {
            this.s = s;
        }

        private void ws() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
                i++;
            }
        }

        private Object value() {
            ws();
            char c = s.charAt(i);
            if (c == '{') {
                Map<String, Object> m = new HashMap<>();
                i++;
                ws();
                if (s.charAt(i) == '}') {
                    i++;
                    return m;
                }
                while (true) {
                    ws();
                    String k = string();
                    ws();
                    i++; // ':'
                    m.put(k, value());
                    ws();
                    if (s.charAt(i++) == '}') {
                        return m;
                    }
                }
            }
            if (c == '"') {
                return string();
            }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) {
                i++;
            }
            if (i > start) {
                return Double.valueOf(s.substring(start, i));
            }
            for (String lit : new String[] {"true", "false", "null"}) {
                if (s.startsWith(lit, i)) {
                    i += lit.length();
                    return lit.equals("null") ? null : Boolean.valueOf(lit);
                }
            }
            throw new IllegalArgumentException("unsupported JSON at " + i);
        }

        private String string() {
            StringBuilder b = new StringBuilder();
            i++; // opening quote
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') {
                    return b.toString();
                }
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': b.append('\n'); break;
                    case 't': b.append('\t'); break;
                    case 'r': b.append('\r'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'u':
                        b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                        break;
                    default: b.append(e);
                }
            }
        }

        static String write(Object v) {
            if (v == null) {
                return "null";
            }
            if (v instanceof Map) {
                StringBuilder b = new StringBuilder("{");
                for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                    if (b.length() > 1) {
                        b.append(',');
                    }
                    b.append(write(String.valueOf(e.getKey()))).append(':').append(write(e.getValue()));
                }
                return b.append('}').toString();
            }
            if (v instanceof Number || v instanceof Boolean) {
                return String.valueOf(v);
            }
            String s = String.valueOf(v);
            StringBuilder b = new StringBuilder("\"");
            for (int k = 0; k < s.length(); k++) {
                char c = s.charAt(k);
                switch (c) {
                    case '"': b.append("\\\""); break;
                    case '\\': b.append("\\\\"); break;
                    case '\n': b.append("\\n"); break;
                    case '\r': b.append("\\r"); break;
                    case '\t': b.append("\\t"); break;
                    default:
                        if (c < 0x20) {
                            b.append(String.format("\\u%04x", (int) c));
                        } else {
                            b.append(c);
                        }
                }
            }
            return b.append('"').toString();
        }
    }
}
