// Package outside is the outside-attack suite: every defence of agentbox
// attacked from the side it guards, against a real server, with one row per
// attack in an attack × outcome table printed at the end of the run:
//
//	side         attack                                   outcome  detail
//	tenant       other team GET /sandboxes/{id}           blocked  404
//	host-user    nobody reads the data dir                CROSSED  read agentbox.db
//
// Sides: tenant (another API key), host-user (an unprivileged user on the
// server host), build (a template build), sandbox→proxy, sandbox→resolver,
// sandbox→interpreter (from inside a sandbox against the host service named)
// neighbour (one sandbox against another) and sandbox→volume (a sandbox's
// root against its volume mount, and through the files it leaves in the
// volume, against the server's volume content API), outsider (no key at all),
// web-page (a page a sandbox serves, opened in a browser logged into the
// dashboard), shared address (a client behind an address other teams use too),
// sandbox→owner (a sandbox's workload against its owner's control of it)
// and stored image (a snapshot image a node reads back from the object
// store and unpacks as root).
// The run fails when any row CROSSED or could not be carried out (error).
//
// # Adding attacks
//
// Put the attacks of an area in their own file, e2e/outside/<area>_test.go,
// as a test that calls runAttacks with a table:
//
//	func TestProxyAttacks(t *testing.T) {
//		s := server(t) // the package's shared server, with a second team
//		runAttacks(t, []attack{{
//			side: sideSandboxProxy,
//			name: "sandbox reaches the proxy's admin port",
//			run: func(t *testing.T) error {
//				if connected { return crossed("connected to %s", addr) }
//				return nil // blocked
//			},
//		}})
//	}
//
// An attack's run returns nil when the attack was blocked, an error made
// with crossed(...) when it got through (say what it got), and any other
// error when it could not be carried out; t.Fatal inside run counts as an
// error too. A test that checks one thing without a table calls
// record(t, side, name, err) with the same convention.
//
// A crossing already known and tracked in an open issue returns gap(...):
// the table shows it as GAP and the run goes on; nothing else may.
//
// An attack must be able to fail: write it so that it CROSSES against a
// server without the defence (and check that once, e.g. by disabling the
// defence locally), then keep it. An attack that crosses today stays in the
// suite; the fix goes where the defence lives.
//
// The tests need root (they fail instead of skipping with
// AGENTBOX_REQUIRE_ROOT=1) and start a server, so run them serialised:
//
//	flock /tmp/agentbox-e2e.lock go test -count=1 -v ./e2e/outside
package outside
