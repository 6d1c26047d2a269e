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

// desktopDefinition is the builtin "desktop": base plus what the
// @e2b/desktop SDK runs inside its sandbox. Like E2B's desktop template it
// starts no display itself: Sandbox.create starts Xvfb on the display and
// at the resolution the caller asked for, then an XFCE session (it waits
// for xfce4-session, xfwm4 and xfdesktop); stream.start() runs x11vnc and
// /opt/noVNC/utils/novnc_proxy (noVNC on 6080), and waits for the port
// with netstat. Input is xdotool, screenshots scrot, the screen size
// xrandr, open xdg-open and launch gtk-launch. A display already running
// at start would take the SDK's display and ports, so none is.
//
// Debian's noVNC lives in /usr/share/novnc and finds the websockify
// package by itself; /opt/noVNC points there. Chromium (the default
// browser for xdg-open) runs without its own sandbox, as in the browser
// template: the container is the sandbox. The screen saver is off, as a
// desktop someone watches through a stream should not blank.
func desktopDefinition(base Definition) Definition {
	return Definition{
		Name:  "desktop",
		Suite: DefaultSuite,
		Base:  &base,
		Packages: []string{
			"xvfb", "xauth", "x11-utils", "x11-xserver-utils", "dbus-x11",
			"xfce4-session", "xfwm4", "xfdesktop4", "xfce4-panel", "xfce4-settings", "thunar",
			"xfce4-terminal", "mousepad", "chromium", "fonts-liberation", "fonts-dejavu-core",
			"adwaita-icon-theme", "desktop-file-utils", "xdg-utils", "libgtk-3-bin",
			"xdotool", "scrot", "x11vnc", "novnc", "websockify", "net-tools",
		},
		MemoryMB: 2048,
		Env:      map[string]string{"DISPLAY": ":0"},
		Run: []string{
			"mkdir -p /opt && ln -sfn /usr/share/novnc /opt/noVNC && ln -sfn vnc.html /usr/share/novnc/index.html",
			"echo 'export CHROMIUM_FLAGS=\"$CHROMIUM_FLAGS --no-sandbox --disable-dev-shm-usage\"' > /etc/chromium.d/agentbox",
			"printf '%s\\n' '[Desktop Entry]' 'Type=Application' 'Name=Screen saver off' " +
				"'Exec=xset s off s noblank' 'NoDisplay=true' > /etc/xdg/autostart/agentbox-noblank.desktop",
			"update-desktop-database /usr/share/applications",
		},
	}
}
