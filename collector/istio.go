package collector

import (
	"context"
	"fmt"
	"slices"
	"strings"

	analysisapi "istio.io/api/analysis/v1alpha1"
	metaapi "istio.io/api/meta/v1alpha1"
	extensionsv1alpha1 "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/fleetgraph/fleetgraph/index"
)

const (
	istioNetworking = "networking.istio.io"
	istioSecurity   = "security.istio.io"
	istioExtensions = "extensions.istio.io"
	// IstioSystemNamespace is where the control plane and its mesh config
	// live.
	IstioSystemNamespace = "istio-system"
)

// istioAdapters collect the Istio kinds through istio.io/client-go's typed
// clients.
func istioAdapters() []*Adapter {
	return []*Adapter{
		typed(istioNetworking, "v1", "VirtualService", func() *networkingv1.VirtualService { return &networkingv1.VirtualService{} },
			func(c *Clients) (listFunc[*networkingv1.VirtualServiceList], watchFunc) {
				x := c.Istio.NetworkingV1().VirtualServices(metav1.NamespaceAll)
				return x.List, x.Watch
			}, func(o *networkingv1.VirtualService) Normalized {
				return istioStatus(&o.Status, o.Generation, map[string]any{
					"hosts": o.Spec.GetHosts(), "gateways": o.Spec.GetGateways(), "httpRoutes": len(o.Spec.GetHttp()),
				})
			}),
		typed(istioNetworking, "v1", "DestinationRule", func() *networkingv1.DestinationRule { return &networkingv1.DestinationRule{} },
			func(c *Clients) (listFunc[*networkingv1.DestinationRuleList], watchFunc) {
				x := c.Istio.NetworkingV1().DestinationRules(metav1.NamespaceAll)
				return x.List, x.Watch
			}, func(o *networkingv1.DestinationRule) Normalized {
				summary := map[string]any{"host": o.Spec.GetHost(), "subsets": len(o.Spec.GetSubsets())}
				if tls := o.Spec.GetTrafficPolicy().GetTls(); tls != nil {
					summary["tlsMode"] = tls.GetMode().String()
				}
				return istioStatus(&o.Status, o.Generation, summary)
			}),
		typed(istioNetworking, "v1", "Gateway", func() *networkingv1.Gateway { return &networkingv1.Gateway{} },
			func(c *Clients) (listFunc[*networkingv1.GatewayList], watchFunc) {
				x := c.Istio.NetworkingV1().Gateways(metav1.NamespaceAll)
				return x.List, x.Watch
			}, func(o *networkingv1.Gateway) Normalized {
				var hosts []string
				for _, s := range o.Spec.GetServers() {
					hosts = append(hosts, s.GetHosts()...)
				}
				return istioStatus(&o.Status, o.Generation, map[string]any{
					"selector": o.Spec.GetSelector(), "servers": len(o.Spec.GetServers()), "hosts": hosts,
				})
			}),
		typed(istioNetworking, "v1", "ServiceEntry", func() *networkingv1.ServiceEntry { return &networkingv1.ServiceEntry{} },
			func(c *Clients) (listFunc[*networkingv1.ServiceEntryList], watchFunc) {
				x := c.Istio.NetworkingV1().ServiceEntries(metav1.NamespaceAll)
				return x.List, x.Watch
			}, func(o *networkingv1.ServiceEntry) Normalized {
				return istioStatus(&o.Status, o.Generation, map[string]any{
					"hosts": o.Spec.GetHosts(), "location": o.Spec.GetLocation().String(), "resolution": o.Spec.GetResolution().String(),
				})
			}),
		typed(istioNetworking, "v1", "Sidecar", func() *networkingv1.Sidecar { return &networkingv1.Sidecar{} },
			func(c *Clients) (listFunc[*networkingv1.SidecarList], watchFunc) {
				x := c.Istio.NetworkingV1().Sidecars(metav1.NamespaceAll)
				return x.List, x.Watch
			}, func(o *networkingv1.Sidecar) Normalized {
				return istioStatus(&o.Status, o.Generation, map[string]any{
					"workloadSelector": o.Spec.GetWorkloadSelector().GetLabels(), "egress": len(o.Spec.GetEgress()), "ingress": len(o.Spec.GetIngress()),
				})
			}),
		typed(istioNetworking, "v1alpha3", "EnvoyFilter", func() *networkingv1alpha3.EnvoyFilter { return &networkingv1alpha3.EnvoyFilter{} },
			func(c *Clients) (listFunc[*networkingv1alpha3.EnvoyFilterList], watchFunc) {
				x := c.Istio.NetworkingV1alpha3().EnvoyFilters(metav1.NamespaceAll)
				return x.List, x.Watch
			}, func(o *networkingv1alpha3.EnvoyFilter) Normalized {
				return istioStatus(&o.Status, o.Generation, map[string]any{
					"workloadSelector": o.Spec.GetWorkloadSelector().GetLabels(), "patches": len(o.Spec.GetConfigPatches()), "priority": o.Spec.GetPriority(),
				})
			}),
		typed(istioSecurity, "v1", "PeerAuthentication", func() *securityv1.PeerAuthentication { return &securityv1.PeerAuthentication{} },
			func(c *Clients) (listFunc[*securityv1.PeerAuthenticationList], watchFunc) {
				x := c.Istio.SecurityV1().PeerAuthentications(metav1.NamespaceAll)
				return x.List, x.Watch
			}, func(o *securityv1.PeerAuthentication) Normalized {
				summary := map[string]any{"selector": o.Spec.GetSelector().GetMatchLabels()}
				if m := o.Spec.GetMtls(); m != nil {
					summary["mtlsMode"] = m.GetMode().String()
				}
				return istioStatus(&o.Status, o.Generation, summary)
			}),
		typed(istioSecurity, "v1", "RequestAuthentication", func() *securityv1.RequestAuthentication { return &securityv1.RequestAuthentication{} },
			func(c *Clients) (listFunc[*securityv1.RequestAuthenticationList], watchFunc) {
				x := c.Istio.SecurityV1().RequestAuthentications(metav1.NamespaceAll)
				return x.List, x.Watch
			}, func(o *securityv1.RequestAuthentication) Normalized {
				var issuers []string
				for _, r := range o.Spec.GetJwtRules() {
					issuers = append(issuers, r.GetIssuer())
				}
				return istioStatus(&o.Status, o.Generation, map[string]any{"selector": o.Spec.GetSelector().GetMatchLabels(), "issuers": issuers})
			}),
		typed(istioExtensions, "v1alpha1", "WasmPlugin", func() *extensionsv1alpha1.WasmPlugin { return &extensionsv1alpha1.WasmPlugin{} },
			func(c *Clients) (listFunc[*extensionsv1alpha1.WasmPluginList], watchFunc) {
				x := c.Istio.ExtensionsV1alpha1().WasmPlugins(metav1.NamespaceAll)
				return x.List, x.Watch
			}, func(o *extensionsv1alpha1.WasmPlugin) Normalized {
				return istioStatus(&o.Status, o.Generation, map[string]any{
					"url": o.Spec.GetUrl(), "phase": o.Spec.GetPhase().String(), "selector": o.Spec.GetSelector().GetMatchLabels(),
				})
			}),
	}
}

// istioStatusFields is what every Istio status type has (IstioStatus, and
// ServiceEntryStatus which adds addresses).
type istioStatusFields interface {
	GetConditions() []*metaapi.IstioCondition
	GetValidationMessages() []*analysisapi.AnalysisMessageBase
	GetObservedGeneration() int64
}

// istioStatus reads Istio's status: analysis messages of level ERROR make
// an object unhealthy, a false condition makes it progressing, and an
// unobserved generation (when istiod reports generations at all) too.
// Istio objects without status are healthy: most are plain configuration.
func istioStatus(st istioStatusFields, generation int64, summary map[string]any) Normalized {
	n := Normalized{Status: index.StatusHealthy, Summary: summary}
	var warnings []string
	for _, m := range st.GetValidationMessages() {
		text := m.GetType().GetCode() + " " + m.GetType().GetName()
		if doc := m.GetDocumentationUrl(); doc != "" {
			text += " (" + doc + ")"
		}
		switch m.GetLevel().String() {
		case "ERROR":
			n.Status, n.Message = index.StatusUnhealthy, strings.TrimSpace(text)
			return n
		case "WARNING":
			warnings = append(warnings, strings.TrimSpace(text))
		}
	}
	for _, c := range st.GetConditions() {
		if c.GetStatus() == "False" {
			n.Status, n.Message = index.StatusProgressing, strings.TrimSpace(c.GetType()+": "+c.GetMessage())
			return n
		}
	}
	if og := st.GetObservedGeneration(); og > 0 && og < generation {
		n.Status, n.Message = index.StatusProgressing, fmt.Sprintf("generation %d not yet observed by istiod (at %d)", generation, og)
		return n
	}
	if len(warnings) > 0 {
		n.Message = strings.Join(warnings, "; ")
	}
	return n
}

// IstioControlPlane describes the Istio control planes found on a cluster.
type IstioControlPlane struct {
	// Revisions lists istiod revisions ("default" when unlabelled), sorted.
	Revisions []string
	// Versions lists istiod versions from the image tags, sorted.
	Versions []string
	// TrustDomain is the mesh's trust domain from the mesh config.
	TrustDomain string
}

// Metadata returns the control plane as cluster metadata entries, empty
// when no istiod was found.
func (p IstioControlPlane) Metadata() map[string]string {
	if len(p.Revisions) == 0 {
		return nil
	}
	m := map[string]string{
		"istio.revisions": strings.Join(p.Revisions, ","),
		"istio.versions":  strings.Join(p.Versions, ","),
	}
	if p.TrustDomain != "" {
		m["istio.trustDomain"] = p.TrustDomain
	}
	return m
}

// DetectIstio finds istiod deployments in istio-system and reads the mesh
// config. A cluster without Istio, or where the collector may not read
// deployments, gives an empty result and no error: detection is a hint,
// never a reason to fail a cluster.
func DetectIstio(ctx context.Context, c *Clients) (IstioControlPlane, error) {
	var p IstioControlPlane
	deps, err := c.Kube.AppsV1().Deployments(IstioSystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=istiod"})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("list istiod deployments: %w", err)
	}
	for i := range deps.Items {
		rev, version := istiodRevision(&deps.Items[i])
		if !slices.Contains(p.Revisions, rev) {
			p.Revisions = append(p.Revisions, rev)
		}
		if version != "" && !slices.Contains(p.Versions, version) {
			p.Versions = append(p.Versions, version)
		}
		cmName := "istio"
		if rev != "default" {
			cmName += "-" + rev
		}
		if p.TrustDomain == "" {
			p.TrustDomain = meshTrustDomain(ctx, c, cmName)
		}
	}
	slices.Sort(p.Revisions)
	slices.Sort(p.Versions)
	return p, nil
}

// istiodRevision reads the revision label and the image tag of an istiod
// deployment.
func istiodRevision(d *appsv1.Deployment) (rev, version string) {
	rev = d.Labels["istio.io/rev"]
	if rev == "" {
		rev = "default"
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name != "discovery" && len(d.Spec.Template.Spec.Containers) > 1 {
			continue
		}
		if i := strings.LastIndex(c.Image, ":"); i >= 0 && !strings.Contains(c.Image[i:], "/") {
			version = c.Image[i+1:]
		}
	}
	return rev, version
}

// meshTrustDomain reads trustDomain from the "mesh" key of the istio
// ConfigMap; it returns "" when the map or the key is absent.
func meshTrustDomain(ctx context.Context, c *Clients, name string) string {
	cm, err := c.Kube.CoreV1().ConfigMaps(IstioSystemNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	var mesh struct {
		TrustDomain string `json:"trustDomain"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["mesh"]), &mesh); err != nil {
		return ""
	}
	return mesh.TrustDomain
}
