// Command etcd is etcd's own server main, built from the Go module proxy so
// the Kubernetes tests (envtest) need no prebuilt download. It lives in a
// module of its own: etcd's server pins client libraries that differ from
// the ones kube-apiserver requires.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
