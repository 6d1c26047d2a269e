package template

// browserDefinition is the builtin "browser": base plus Chromium, started
// headless with remote debugging. Chromium only listens on loopback
// whatever --remote-debugging-address says (since 2024) and refuses Host
// headers other than an IP or localhost, so it takes 127.0.0.1:9223 and
// cdpProxy publishes it on :9222 for the gateway, header- or host-routed.
// The container is the sandbox, so Chromium's own sandbox (user
// namespaces) is off; /dev/shm is small, so shared memory goes to /tmp; any
// Origin may open the DevTools websocket because the gateway already
// decided who gets through. The ready check waits for the published port.
func browserDefinition(base Definition) Definition {
	return Definition{
		Name:     "browser",
		Suite:    DefaultSuite,
		Base:     &base,
		Packages: []string{"chromium", "fonts-liberation", "fonts-noto-color-emoji"},
		MemoryMB: 2048,
		Run: []string{
			"mkdir -p /usr/local/lib/agentbox && cat > /usr/local/lib/agentbox/cdp-proxy.py <<'EOF'\n" + cdpProxy + "EOF",
		},
		StartCmd: "python3 /usr/local/lib/agentbox/cdp-proxy.py & " +
			"exec chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run " +
			"--remote-debugging-port=9223 --remote-allow-origins=* --user-data-dir=/tmp/chromium about:blank",
		ReadyCmd: "curl -sf http://127.0.0.1:9222/json/version",
	}
}

// cdpProxy is the browser template's DevTools proxy (Python: base has it).
const cdpProxy = `# Publishes Chromium's DevTools endpoint (which only listens on loopback) on
# 0.0.0.0:9222. Chromium refuses Host headers that are neither an IP nor
# localhost, and host-routed gateway URLs are neither, so requests go up with
# "Host: localhost" and JSON answers get the caller's host back in their
# websocket URLs. Websocket upgrades are spliced through as they are.
import asyncio
import re

UPSTREAM = ("127.0.0.1", 9223)
HOST = re.compile(rb"(?im)^host:[ \t]*([^\r\n]*)\r\n")


async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        w.close()


async def handle(cr, cw):
    try:
        head = await cr.readuntil(b"\r\n\r\n")
        ur, uw = await asyncio.open_connection(*UPSTREAM)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        cw.close()
        return
    m = HOST.search(head)
    host = m.group(1).strip() if m else b""
    if m:
        head = head[: m.start()] + b"Host: localhost\r\n" + head[m.end():]
    if re.search(rb"(?im)^upgrade:", head) or not host:
        uw.write(head)
        await asyncio.gather(pipe(cr, uw), pipe(ur, cw))
        return
    # One plain request per connection: answer it, then close.
    head = re.sub(rb"(?im)^connection:[^\r\n]*\r\n", b"", head)
    uw.write(head[:-2] + b"Connection: close\r\n\r\n")
    asyncio.ensure_future(pipe(cr, uw))
    try:
        rhead = await ur.readuntil(b"\r\n\r\n")
        n = re.search(rb"(?im)^content-length:[ \t]*(\d+)", rhead)
        body = await (ur.readexactly(int(n.group(1))) if n else ur.read())
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        cw.close()
        uw.close()
        return
    body = body.replace(b"ws://localhost/", b"ws://" + host + b"/").replace(b"ws=localhost/", b"ws=" + host + b"/")
    rhead = re.sub(rb"(?im)^(content-length|connection):[^\r\n]*\r\n", b"", rhead)
    rhead = rhead[:-2] + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    cw.write(rhead + body)
    try:
        await cw.drain()
    except ConnectionError:
        pass
    cw.close()
    uw.close()


async def main():
    server = await asyncio.start_server(handle, "0.0.0.0", 9222)
    async with server:
        await server.serve_forever()


asyncio.run(main())
`

// desktopDefinition is the builtin "desktop": base plus an X server
// (Xvfb on :1), a window manager (openbox), VNC (x11vnc on :5900, noVNC on
// :6080 through websockify), xdotool for input, ImageMagick for screenshots
// and Chromium to look at. The start command waits for the X socket before
// starting its clients (x11vnc exits when the display is not there yet);
// the ready check waits for the display and noVNC.
func desktopDefinition(base Definition) Definition {
	return Definition{
		Name:  "desktop",
		Suite: DefaultSuite,
		Base:  &base,
		Packages: []string{
			"xvfb", "openbox", "x11vnc", "novnc", "websockify", "xdotool", "x11-utils",
			"xauth", "imagemagick", "chromium", "fonts-liberation",
		},
		MemoryMB: 2048,
		Env:      map[string]string{"DISPLAY": ":1"},
		StartCmd: "Xvfb :1 -screen 0 1280x800x24 -nolisten tcp & " +
			"for i in $(seq 100); do [ -S /tmp/.X11-unix/X1 ] && break; sleep 0.1; done; " +
			"DISPLAY=:1 openbox & " +
			"x11vnc -display :1 -rfbport 5900 -nopw -forever -shared -quiet & " +
			"exec websockify --web /usr/share/novnc 6080 localhost:5900",
		ReadyCmd: `xdpyinfo -display :1 >/dev/null && [ -n "$(ss -Htln sport = :6080)" ]`,
	}
}
