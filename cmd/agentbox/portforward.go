package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

func newPortForwardCmd() *cobra.Command {
	var address string
	cmd := &cobra.Command{
		Use:   "port-forward <sandboxID> [LOCAL:]REMOTE...",
		Short: "Forward local TCP ports to ports inside a sandbox",
		Long: `Listen on local ports and forward every connection to a port inside the
sandbox, through the server (any TCP protocol, not only HTTP), like
kubectl port-forward. LOCAL 0 or omitted picks a free port. Stops on Ctrl-C.
envd's port (49983) is not forwarded: reach envd through the data plane.`,
		Example: `  agentbox port-forward i1a2b3c 8080:8000
  agentbox port-forward i1a2b3c 5432 :6379`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			key, _ := cmd.Flags().GetString("api-key")
			if key == "" {
				key = firstNonEmpty(os.Getenv("AGENTBOX_API_KEY"), os.Getenv("E2B_API_KEY"), localAPIKey())
			}
			base, err := url.Parse(newClient(cmd).APIURL())
			if err != nil {
				return fmt.Errorf("--api-url: %w", err)
			}
			id := args[0]
			var lns []net.Listener
			defer func() {
				for _, l := range lns {
					l.Close()
				}
			}()
			for _, m := range args[1:] {
				local, remote, err := parsePortMapping(m)
				if err != nil {
					return err
				}
				var lc net.ListenConfig
				ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(address, strconv.Itoa(local)))
				if err != nil {
					return fmt.Errorf("listen for %s: %w", m, err)
				}
				lns = append(lns, ln)
				fmt.Fprintf(cmd.OutOrStdout(), "Forwarding from %s -> %d\n", ln.Addr(), remote)
				go acceptForward(ctx, ln, base, key, id, remote, cmd.ErrOrStderr())
			}
			<-ctx.Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local address to listen on")
	return cmd
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// parsePortMapping reads "8080:80", "80" (same local port) or ":80" (any).
func parsePortMapping(s string) (local, remote int, err error) {
	l, r, ok := strings.Cut(s, ":")
	if !ok {
		l, r = s, s
	}
	if remote, err = strconv.Atoi(r); err != nil || remote < 1 || remote > 65535 {
		return 0, 0, fmt.Errorf("port mapping %q: remote port must be 1-65535", s)
	}
	if l == "" {
		return 0, remote, nil
	}
	if local, err = strconv.Atoi(l); err != nil || local < 0 || local > 65535 {
		return 0, 0, fmt.Errorf("port mapping %q: local port must be 0-65535", s)
	}
	return local, remote, nil
}

func acceptForward(ctx context.Context, ln net.Listener, base *url.URL, key, id string, remote int, errw io.Writer) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := openTunnel(ctx, base, key, id, remote)
			if err != nil {
				fmt.Fprintf(errw, "forward %s -> %d: %v\n", c.RemoteAddr(), remote, err)
				return
			}
			defer up.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(up, c)
				if cw, ok := up.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
				close(done)
			}()
			_, _ = io.Copy(c, up)
			if cw, ok := c.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			<-done
		}()
	}
}

// openTunnel asks the server for a raw TCP stream to the sandbox's port.
func openTunnel(ctx context.Context, base *url.URL, key, id string, port int) (net.Conn, error) {
	host := base.Host
	if base.Port() == "" {
		if base.Scheme == "https" {
			host += ":443"
		} else {
			host += ":80"
		}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	if base.Scheme == "https" {
		tc := tls.Client(c, &tls.Config{ServerName: base.Hostname(), NextProtos: []string{"http/1.1"}})
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	path := strings.TrimRight(base.Path, "/") + "/sandboxes/" + url.PathEscape(id) + "/tunnel/" + strconv.Itoa(port)
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nX-API-Key: %s\r\nConnection: Upgrade\r\nUpgrade: agentbox-tcp\r\n\r\n", path, base.Host, key)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
	if err != nil {
		c.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		c.Close()
		return nil, errors.New(resp.Status + ": " + strings.TrimSpace(string(msg)))
	}
	if br.Buffered() > 0 {
		return &bufConn{Conn: c, r: br}, nil
	}
	return c, nil
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *bufConn) CloseWrite() error {
	if cw, ok := b.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
