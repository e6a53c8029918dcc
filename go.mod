module github.com/meshagent/meshagent

go 1.26.0

require (
	github.com/coreos/go-iptables v0.8.0
	github.com/miekg/dns v1.1.73
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.10
	github.com/thejerf/suture/v4 v4.0.6
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.47.0
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.57.0 // indirect
)
