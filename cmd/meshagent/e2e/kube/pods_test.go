package kube

// Pods as the suite creates them: plain application pods in a namespace
// labelled istio-injection=enabled, left for Istio's webhook to inject, and
// what the suite reads back from the API server.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

const (
	testNS   = "e2e"
	appImage = "localhost/kubeapp:e2e"
	// eventsDir is a hostPath every app container appends its
	// termination events to, so the order is still there once the pod is
	// gone (as the peer's demo.sh does).
	eventsDir = "e2e-events"
	// grace is each pod's terminationGracePeriodSeconds.
	grace = 30 * time.Second
)

// podSpec is one pod to create: its app, which image Istio's injector gives
// its sidecar (the proxyImage annotation), native sidecar or istio-init, and
// any proxy.istio.io/config.
type podSpec struct {
	name, app, serviceAccount string
	proxyImage                string
	native                    bool
	proxyConfig               string // JSON for proxy.istio.io/config, or ""
	proxyCPU                  string // sidecar.istio.io/proxyCPU (the sidecar's CPU request), or "" for the injector's 100m
	agentLogLevel             string // sidecar.istio.io/agentLogLevel (the agent's --log_output_level), or ""
	appDrain                  time.Duration
	drainGet                  string   // a URL the app GETs while it drains, or ""
	command                   []string // the app's command instead of kubeapp serve (then no readiness probe), or nil
}

// manifest is the Pod, as JSON (which kubectl takes as YAML).
func (p podSpec) manifest(n *node) string {
	pod := p.template(n)
	pod["apiVersion"], pod["kind"] = "v1", "Pod"
	pod["metadata"].(map[string]any)["name"] = p.name
	pod["metadata"].(map[string]any)["namespace"] = testNS
	out, err := json.Marshal(pod)
	if err != nil {
		panic(err) // maps of strings and numbers
	}
	return string(out) + "\n"
}

// template is the pod's metadata (labels, annotations) and spec: a Pod's
// without its name, a Deployment's pod template.
func (p podSpec) template(n *node) map[string]any {
	annotations := map[string]string{"sidecar.istio.io/proxyImage": p.proxyImage, "sidecar.istio.io/nativeSidecar": fmt.Sprint(p.native)}
	if p.proxyConfig != "" {
		annotations["proxy.istio.io/config"] = p.proxyConfig
	}
	if p.proxyCPU != "" {
		annotations["sidecar.istio.io/proxyCPU"] = p.proxyCPU
	}
	if p.agentLogLevel != "" {
		annotations["sidecar.istio.io/agentLogLevel"] = p.agentLogLevel
	}
	app := map[string]any{
		"name": "app", "image": appImage, "imagePullPolicy": "IfNotPresent",
		"command":        []string{"/kubeapp", "serve", "-addr", ":8080", "-events", "/events/$(POD_NAME).log", "-drain", p.appDrain.String(), "-drain-get", p.drainGet},
		"env":            []any{map[string]any{"name": "POD_NAME", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "metadata.name"}}}},
		"ports":          []any{map[string]any{"containerPort": 8080, "name": "http"}},
		"readinessProbe": map[string]any{"httpGet": map[string]any{"path": "/healthz", "port": 8080}, "periodSeconds": 1},
		"volumeMounts":   []any{map[string]any{"name": "events", "mountPath": "/events"}},
	}
	if p.command != nil {
		app["command"] = p.command
		delete(app, "readinessProbe")
	}
	return map[string]any{
		"metadata": map[string]any{"labels": map[string]string{"app": p.app}, "annotations": annotations},
		"spec": map[string]any{
			"serviceAccountName":            p.serviceAccount,
			"terminationGracePeriodSeconds": int(grace / time.Second),
			"containers":                    []any{app},
			"volumes":                       []any{map[string]any{"name": "events", "hostPath": map[string]any{"path": n.root + "/" + eventsDir, "type": "DirectoryOrCreate"}}},
		},
	}
}

// baseManifests is the namespace, labelled for Istio's injector, and the
// service accounts and services the pods use.
func baseManifests(accounts, apps []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n  labels: {istio-injection: enabled}\n", testNS)
	for _, sa := range accounts {
		b.WriteString("---\n" + serviceAccount(sa))
	}
	for _, app := range apps {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: %s}\nspec:\n  selector: {app: %s}\n  ports: [{name: http, port: 8080, targetPort: 8080}]\n", app, testNS, app)
	}
	return b.String()
}

// serviceAccount is the manifest of a service account in the test
// namespace.
func serviceAccount(name string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: %s, namespace: %s}\n", name, testNS)
}

// pod is the part of a Pod the suite reads.
type pod struct {
	Metadata struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		InitContainers []container `json:"initContainers"`
		Containers     []container `json:"containers"`
		Volumes        []struct {
			Name      string `json:"name"`
			Projected *struct {
				Sources []struct {
					ServiceAccountToken *struct {
						Audience string `json:"audience"`
					} `json:"serviceAccountToken"`
				} `json:"sources"`
			} `json:"projected"`
		} `json:"volumes"`
	} `json:"spec"`
	Status struct {
		PodIP      string `json:"podIP"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
		InitContainerStatuses []containerStatus `json:"initContainerStatuses"`
		ContainerStatuses     []containerStatus `json:"containerStatuses"`
	} `json:"status"`
}

type container struct {
	Name           string   `json:"name"`
	Image          string   `json:"image"`
	Args           []string `json:"args"`
	RestartPolicy  string   `json:"restartPolicy"`
	ReadinessProbe *probe   `json:"readinessProbe"`
	StartupProbe   *probe   `json:"startupProbe"`
	Lifecycle      *struct {
		PreStop *struct {
			Exec *struct {
				Command []string `json:"command"`
			} `json:"exec"`
		} `json:"preStop"`
	} `json:"lifecycle"`
}

type probe struct {
	HTTPGet *struct {
		Path string `json:"path"`
		Port any    `json:"port"`
	} `json:"httpGet"`
}

type containerStatus struct {
	Name         string `json:"name"`
	ContainerID  string `json:"containerID"`
	ImageID      string `json:"imageID"`
	RestartCount int    `json:"restartCount"`
	Ready        bool   `json:"ready"`
}

func (n *node) getPod(t testing.TB, name string) pod {
	t.Helper()
	var p pod
	if err := json.Unmarshal([]byte(n.mustKubectl(t, "", "-n", testNS, "get", "pod", name, "-o", "json")), &p); err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	return p
}

func (p pod) ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// tokenAudiences lists the audiences of the projected service-account
// tokens of the pod's volumes, by volume.
func (p pod) tokenAudiences() map[string]string {
	out := map[string]string{}
	for _, v := range p.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.ServiceAccountToken != nil {
				out[v.Name] = src.ServiceAccountToken.Audience
			}
		}
	}
	return out
}

// proxy is the istio-proxy container (an init container when native).
func (p pod) proxy() (c container, native bool, ok bool) {
	for _, c := range p.Spec.InitContainers {
		if c.Name == "istio-proxy" {
			return c, c.RestartPolicy == "Always", true
		}
	}
	for _, c := range p.Spec.Containers {
		if c.Name == "istio-proxy" {
			return c, false, true
		}
	}
	return container{}, false, false
}

func (p pod) status(name string) (containerStatus, bool) {
	for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if s.Name == name {
			return s, true
		}
	}
	return containerStatus{}, false
}

func (p pod) container(name string) (container, bool) {
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		if c.Name == name {
			return c, true
		}
	}
	return container{}, false
}

// create applies a pod and waits until the kubelet reports it Ready; it
// returns the time from the create call to Ready as the API server's watch
// delivers it (`kubectl wait`).
func (n *node) createReady(t testing.TB, p podSpec, timeout time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	if _, err := n.kubectl(p.manifest(n), "apply", "-f", "-"); err != nil {
		return 0, err
	}
	if _, err := n.kubectl("", "-n", testNS, "wait", "--for=condition=Ready", "pod/"+p.name, "--timeout="+timeout.String()); err != nil {
		return 0, fmt.Errorf("pod %s not Ready within %v: %w\n%s", p.name, timeout, err, n.describe(p.name))
	}
	return time.Since(start), nil
}

// describe is what a person would look at when a pod does not turn Ready.
func (n *node) describe(name string) string {
	out, _ := n.kubectl("", "-n", testNS, "describe", "pod", name)
	var logs strings.Builder
	for _, c := range []string{"istio-proxy", "istio-init", "app"} {
		l, _ := n.kubectl("", "-n", testNS, "logs", name, "-c", c, "--tail=40")
		if l != "" {
			fmt.Fprintf(&logs, "--- logs of %s:\n%s", c, l)
		}
	}
	return out + logs.String()
}

// exec runs a command in one container of a pod.
func (n *node) exec(pod, container string, args ...string) (string, error) {
	return n.kubectl("", append([]string{"-n", testNS, "exec", pod, "-c", container, "--"}, args...)...)
}
