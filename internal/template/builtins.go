package template

// browserDefinition is the builtin "browser": base plus Chromium, started
// headless with remote debugging. Chromium only listens on loopback
// whatever --remote-debugging-address says (since 2024), so it takes
// 127.0.0.1:9223 and socat publishes it on :9222 for the gateway. The
// container is the sandbox, so Chromium's own sandbox (user namespaces) is
// off; /dev/shm is small, so shared memory goes to /tmp; any Origin may
// open the DevTools websocket because the gateway already decided who gets
// through. The ready check waits for the published port.
func browserDefinition(base Definition) Definition {
	return Definition{
		Name:     "browser",
		Suite:    DefaultSuite,
		Base:     &base,
		Packages: []string{"chromium", "fonts-liberation", "fonts-noto-color-emoji", "socat"},
		MemoryMB: 2048,
		StartCmd: "socat TCP-LISTEN:9222,fork,reuseaddr TCP:127.0.0.1:9223 & " +
			"exec chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run " +
			"--remote-debugging-port=9223 --remote-allow-origins=* --user-data-dir=/tmp/chromium about:blank",
		ReadyCmd: "curl -sf http://127.0.0.1:9222/json/version",
	}
}

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
