package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// This file is the part of Envoy's start-up the agent's readiness depends
// on, so that the stand-in is never kinder than Envoy:
//
//   - With dynamic resources, Envoy stays PRE_INITIALIZING (admin /ready
//     answers 503) until its cluster manager has initialised — the first CDS
//     response accepted and every cluster in it warmed: an EDS cluster by
//     its ClusterLoadAssignment, then any cluster by the SDS secrets its
//     transport sockets name (sds.go) — and then its listeners — the first
//     LDS response accepted and every RDS route config and SDS secret they
//     name received. LDS is only requested once the clusters are
//     initialised. initial_fetch_timeout (15s when unset, never when 0s as
//     Istio sets it) lets a phase or a secret go ahead without a response.
//   - Its listeners (the bootstrap's and LDS's, not the admin) listen and
//     accept only once the workers start, when /ready turns LIVE: until
//     then a connection to 15021 is refused (workers.go).
//   - A stream that ends is redialled with Envoy's backoff (backoff.go).
//   - It counts updates as Envoy does (cluster_manager.cds.update_attempt,
//     update_success, update_rejected; listener_manager.lds.*), sets
//     listener_manager.workers_started once its workers started with every
//     listener listening (workers.go), and /stats?usedonly shows only stats
//     that were ever written.
//   - It rejects (NACKs) a response with an invalid resource (protoc-gen-
//     validate rules, as Envoy's config validation), or any response of a
//     type named in FAKE_ENVOY_REJECT, and then keeps its previous config.

// Type URLs of the four resource types Envoy's init waits for.
const (
	typeEndpoint = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	typeRoute    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	// typeExtensionConfig (ECDS): not an init type; Wasm filters come this
	// way (checkWasm).
	typeExtensionConfig = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
)

// statPrefix is where Envoy counts updates of a type: cds and lds have their
// own stats; eds and rds are counted per cluster and route config, which
// the fake sums under these names.
var statPrefix = map[string]string{
	typeCluster:  "cluster_manager.cds.",
	typeListener: "listener_manager.lds.",
	typeEndpoint: "cluster_manager.eds.",
	typeRoute:    "http.rds.",
}

// shortType is the FAKE_ENVOY_REJECT name of a type URL.
var shortType = map[string]string{typeCluster: "cds", typeListener: "lds", typeEndpoint: "eds", typeRoute: "rds"}

// xdsConfig is what Envoy holds from xDS. It survives ADS reconnects (Envoy
// keeps its configuration across a stream reset) and is guarded by envoy.mu.
type xdsConfig struct {
	resources map[string]map[string]proto.Message // type URL -> name -> resource
	versions  map[string]string                   // SotW: type URL -> last accepted version
	// resourceVersions: Delta: type URL -> name -> version (Envoy's
	// initial_resource_versions on a reconnect).
	resourceVersions map[string]map[string]string
	// updated: type URL -> name -> when the resource was last accepted
	// (/config_dump's last_updated).
	updated map[string]map[string]time.Time

	// secrets: cluster or listener type URL -> name -> the secrets it
	// names over SDS (sds.go).
	secrets map[string]map[string][]secretRef
	// sdsTimedOut: secrets whose initial_fetch_timeout passed before they
	// came.
	sdsTimedOut map[string]bool

	cdsDone       bool // the first CDS response accepted (or timed out, or no CDS)
	clustersDone  bool // cluster manager initialised: LDS may be requested
	ldsDone       bool // the first LDS response accepted (or timed out, or no LDS)
	listenersDone bool // listeners initialised
	live          bool // init complete (latched: Envoy never goes back)
}

func newXDSConfig() *xdsConfig {
	return &xdsConfig{
		resources:        map[string]map[string]proto.Message{},
		versions:         map[string]string{},
		resourceVersions: map[string]map[string]string{},
		updated:          map[string]map[string]time.Time{},
		secrets:          map[string]map[string][]secretRef{},
		sdsTimedOut:      map[string]bool{},
	}
}

// hasDynamicResources: with none, Envoy initialises at once.
func (e *envoy) hasDynamicResources() bool {
	d := e.boot.GetDynamicResources()
	return d.GetCdsConfig() != nil || d.GetLdsConfig() != nil
}

// startInit begins Envoy's init: at once without dynamic resources, else
// when xDS answers or the initial fetch timeouts pass.
func (e *envoy) startInit() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.setStatLocked("server.state", statePreInitializing)
	for _, c := range e.boot.GetStaticResources().GetClusters() {
		e.staticSecrets[typeCluster] = append(e.staticSecrets[typeCluster], clusterSecrets(c)...)
	}
	for _, l := range e.boot.GetStaticResources().GetListeners() {
		e.staticSecrets[typeListener] = append(e.staticSecrets[typeListener], listenerSecrets(l)...)
	}
	d := e.boot.GetDynamicResources()
	if d.GetCdsConfig() == nil {
		e.xds.cdsDone = true
	} else if t := initialFetchTimeout(d.GetCdsConfig()); t > 0 {
		time.AfterFunc(t, func() { e.fetchTimedOut(typeCluster) })
	}
	if d.GetLdsConfig() == nil {
		e.xds.ldsDone = true
	}
	e.advanceInitLocked()
}

// initialFetchTimeout is Envoy's: 15s when unset, none when 0s.
func initialFetchTimeout(cs *corev3.ConfigSource) time.Duration {
	if cs.GetInitialFetchTimeout() == nil {
		return 15 * time.Second
	}
	return cs.GetInitialFetchTimeout().AsDuration()
}

func (e *envoy) fetchTimedOut(typeURL string) {
	defer e.announceLive()
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case typeURL == typeCluster && !e.xds.cdsDone:
		e.bumpStatLocked("cluster_manager.cds.init_fetch_timeout")
		e.xds.cdsDone = true
	case typeURL == typeListener && e.xds.clustersDone && !e.xds.ldsDone:
		e.bumpStatLocked("listener_manager.lds.init_fetch_timeout")
		e.xds.ldsDone = true
	default:
		return
	}
	e.advanceInitLocked()
}

// advanceInitLocked moves init forward: clusters (CDS, then every
// cluster's endpoints and secrets), then listeners (LDS, then every
// listener's route configs and secrets), then live.
func (e *envoy) advanceInitLocked() {
	x := e.xds
	if x.live {
		return
	}
	if !x.cdsDone && e.accepted(typeCluster) {
		x.cdsDone = true
	}
	if x.cdsDone && !x.clustersDone && e.initializedLocked(typeCluster, e.clusterWarmingLocked) {
		x.clustersDone = true
		select { // the ADS stream asks for listeners now (runADS)
		case e.initMoved <- struct{}{}:
		default:
		}
	}
	if x.clustersDone && !x.ldsDone && e.accepted(typeListener) {
		x.ldsDone = true
	}
	if x.clustersDone && x.ldsDone && !x.listenersDone && e.initializedLocked(typeListener, e.listenerWarmingLocked) {
		x.listenersDone = true
	}
	if x.clustersDone && x.listenersDone {
		x.live = true // the workers start next (workers.go), and count themselves
		e.setStatLocked("server.state", stateLive)
	}
}

// ldsWantedLocked: Envoy asks for listeners only once its clusters are
// initialised, and only if the bootstrap has an LDS config.
func (e *envoy) ldsWantedLocked() bool {
	return e.xds.clustersDone && e.boot.GetDynamicResources().GetLdsConfig() != nil
}

// armListenerTimeout starts LDS's initial fetch timeout when LDS is first
// requested.
func (e *envoy) armListenerTimeout() {
	if t := initialFetchTimeout(e.boot.GetDynamicResources().GetLdsConfig()); t > 0 {
		time.AfterFunc(t, func() { e.fetchTimedOut(typeListener) })
	}
}

func (e *envoy) accepted(typeURL string) bool {
	return e.statLocked(statPrefix[typeURL]+"update_success") > 0
}

func (e *envoy) allPresent(typeURL string, names []string) bool {
	for _, n := range names {
		if _, ok := e.xds.resources[typeURL][n]; !ok {
			return false
		}
	}
	return true
}

// edsNamesLocked are the ClusterLoadAssignments the EDS clusters need.
func (e *envoy) edsNamesLocked() []string {
	var names []string
	for name, m := range e.xds.resources[typeCluster] {
		c := m.(*clusterv3.Cluster)
		if c.GetType() != clusterv3.Cluster_EDS {
			continue
		}
		if sn := c.GetEdsClusterConfig().GetServiceName(); sn != "" {
			name = sn
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// rdsNamesLocked are the route configs the listeners' HTTP connection
// managers name.
func (e *envoy) rdsNamesLocked() []string {
	seen := map[string]bool{}
	for _, m := range e.xds.resources[typeListener] {
		for _, n := range routeNames(m.(*listenerv3.Listener)) {
			seen[n] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// routeNames are the route configs one listener's HTTP connection
// managers name.
func routeNames(l *listenerv3.Listener) []string {
	var names []string
	for _, fc := range append([]*listenerv3.FilterChain{l.GetDefaultFilterChain()}, l.GetFilterChains()...) {
		for _, f := range fc.GetFilters() {
			hcm := &hcmv3.HttpConnectionManager{}
			if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(hcm) != nil {
				continue
			}
			if n := hcm.GetRds().GetRouteConfigName(); n != "" {
				names = append(names, n)
			}
		}
	}
	return names
}

// ecdsNamesLocked are the extension configs (ECDS) the listeners' filters
// discover: network filters and HTTP filters with config_discovery, as
// istiod configures a WasmPlugin.
func (e *envoy) ecdsNamesLocked() []string {
	seen := map[string]bool{}
	for _, m := range e.xds.resources[typeListener] {
		l := m.(*listenerv3.Listener)
		for _, fc := range append([]*listenerv3.FilterChain{l.GetDefaultFilterChain()}, l.GetFilterChains()...) {
			for _, f := range fc.GetFilters() {
				if f.GetConfigDiscovery() != nil {
					seen[f.GetName()] = true
				}
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					if hf.GetConfigDiscovery() != nil {
						seen[hf.GetName()] = true
					}
				}
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// subscriptionLocked is the resource names Envoy subscribes to for a type:
// nil for the wildcard types (CDS, LDS).
func (e *envoy) subscriptionLocked(typeURL string) []string {
	switch typeURL {
	case typeEndpoint:
		return e.edsNamesLocked()
	case typeRoute:
		return e.rdsNamesLocked()
	case typeExtensionConfig:
		return e.ecdsNamesLocked()
	}
	return nil
}

// update is one xDS response to apply: SotW (replace all of the type, or the
// named ones for EDS/RDS) or Delta (add/update, remove).
type update struct {
	typeURL string
	version string
	sotw    bool
	added   []*anypb.Any
	// addedVersions: Delta only, the version of each added resource.
	addedVersions []string
	removed       []string
}

// apply validates and applies an update as Envoy would: all or nothing. A
// non-nil error is the NACK's message; the previous config stays.
func (e *envoy) apply(u update) error {
	decoded := make([]proto.Message, 0, len(u.added))
	var err error
	if reject := e.k.reject[shortType[u.typeURL]]; reject {
		err = fmt.Errorf("rejected by FAKE_ENVOY_REJECT=%s", shortType[u.typeURL])
	}
	for _, a := range u.added {
		if err != nil {
			break
		}
		m, derr := a.UnmarshalNew()
		if derr != nil {
			err = fmt.Errorf("resource of type %s: %v", a.GetTypeUrl(), derr)
			break
		}
		if n := e.k.rejectName; n != "" && strings.Contains(resourceName(m), n) {
			err = fmt.Errorf("%s %q: rejected by FAKE_ENVOY_REJECT_NAME=%s", shortType[u.typeURL], resourceName(m), n)
			break
		}
		if v, ok := m.(interface{ ValidateAll() error }); ok {
			if verr := v.ValidateAll(); verr != nil {
				err = fmt.Errorf("%s %q: %v", shortType[u.typeURL], resourceName(m), verr)
				break
			}
		}
		if l, ok := m.(*listenerv3.Listener); ok {
			if err = e.bindCheck(l); err != nil {
				break
			}
		}
		decoded = append(decoded, m)
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	prefix := statPrefix[u.typeURL]
	if prefix != "" {
		e.bumpStatLocked(prefix + "update_attempt")
	}
	if err != nil {
		if prefix != "" {
			e.bumpStatLocked(prefix + "update_rejected")
		}
		return err
	}
	have := e.xds.resources[u.typeURL]
	if have == nil || (u.sotw && (u.typeURL == typeCluster || u.typeURL == typeListener)) {
		// A SotW CDS/LDS response is the whole set.
		have = map[string]proto.Message{}
		e.xds.resources[u.typeURL] = have
	}
	versions := e.xds.resourceVersions[u.typeURL]
	if versions == nil {
		versions = map[string]string{}
		e.xds.resourceVersions[u.typeURL] = versions
	}
	updated := e.xds.updated[u.typeURL]
	secrets := e.xds.secrets[u.typeURL]
	if updated == nil || (u.sotw && (u.typeURL == typeCluster || u.typeURL == typeListener)) {
		updated, secrets = map[string]time.Time{}, map[string][]secretRef{}
		e.xds.updated[u.typeURL], e.xds.secrets[u.typeURL] = updated, secrets
	}
	now := time.Now()
	for i, m := range decoded {
		name := resourceName(m)
		have[name] = m
		updated[name] = now
		if refs := secretsOf(m); refs != nil {
			secrets[name] = refs
		} else {
			delete(secrets, name)
		}
		if i < len(u.addedVersions) {
			versions[name] = u.addedVersions[i]
		}
	}
	for _, name := range u.removed {
		delete(have, name)
		delete(versions, name)
		delete(updated, name)
		delete(secrets, name)
	}
	if u.sotw {
		e.xds.versions[u.typeURL] = u.version
	}
	if prefix != "" {
		e.bumpStatLocked(prefix + "update_success")
	}
	e.advanceInitLocked()
	return nil
}

// resourceName is a resource's name: Name, or ClusterName for a
// ClusterLoadAssignment.
func resourceName(m proto.Message) string {
	switch r := m.(type) {
	case *endpointv3.ClusterLoadAssignment:
		return r.GetClusterName()
	case *routev3.RouteConfiguration:
		return r.GetName()
	case interface{ GetName() string }:
		if r.GetName() != "" {
			return r.GetName()
		}
	}
	return fmt.Sprintf("%T", m)
}

// parseReject reads FAKE_ENVOY_REJECT: a comma-separated list of cds, lds,
// eds, rds.
func parseReject(v string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		switch s {
		case "cds", "lds", "eds", "rds":
			out[s] = true
		default:
			return nil, fmt.Errorf("FAKE_ENVOY_REJECT: %q is not one of cds, lds, eds, rds", s)
		}
	}
	return out, nil
}
