package template

import "slices"

// browserDefinition is the builtin "browser": base plus Chromium, started
// headless with remote debugging on :9222 (the container is the sandbox, so
// Chromium's own needs user namespaces and is off; /dev/shm is small, so
// shared memory goes to /tmp). The ready check waits for the DevTools port.
func browserDefinition(base Definition) Definition {
	return Definition{
		Name:     "browser",
		Suite:    DefaultSuite,
		Packages: slices.Concat(base.Packages, []string{"chromium", "fonts-liberation", "fonts-noto-color-emoji"}),
		MemoryMB: 2048,
		StartCmd: "chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage " +
			"--remote-debugging-address=0.0.0.0 --remote-debugging-port=9222 --user-data-dir=/tmp/chromium about:blank",
		ReadyCmd: "curl -sf http://127.0.0.1:9222/json/version",
	}
}

// desktopDefinition is the builtin "desktop": base plus an X server
// (Xvfb), a window manager (openbox), VNC (x11vnc on :5900, noVNC on :6080
// through websockify), xdotool for input and Chromium to look at. The start
// command runs them all; the ready check waits for VNC.
func desktopDefinition(base Definition) Definition {
	return Definition{
		Name:  "desktop",
		Suite: DefaultSuite,
		Packages: slices.Concat(base.Packages, []string{
			"xvfb", "openbox", "x11vnc", "novnc", "websockify", "xdotool", "x11-utils",
			"xauth", "imagemagick", "chromium", "fonts-liberation",
		}),
		MemoryMB: 2048,
		Env:      map[string]string{"DISPLAY": ":1"},
		StartCmd: "Xvfb :1 -screen 0 1280x800x24 -nolisten tcp & sleep 0.3; openbox & " +
			"x11vnc -display :1 -rfbport 5900 -nopw -forever -shared -quiet & " +
			"websockify --web /usr/share/novnc 6080 localhost:5900",
		ReadyCmd: `[ -n "$(ss -Htln sport = :5900)" ]`,
	}
}
