package index

// The RBAC kinds. Rows of these kinds in group RBACGroup carry a Policy.
const (
	KindRole               = "Role"
	KindClusterRole        = "ClusterRole"
	KindRoleBinding        = "RoleBinding"
	KindClusterRoleBinding = "ClusterRoleBinding"
)

// Policy is the RBAC content of a Role, ClusterRole, RoleBinding or
// ClusterRoleBinding row. Roles fill Rules; bindings fill RoleRef and
// Subjects. Aggregated ClusterRoles are stored with the rules the
// aggregation controller wrote into .rules, which is what the Kubernetes
// authorizer evaluates.
type Policy struct {
	Rules    []PolicyRule `json:"rules,omitempty"`
	RoleRef  RoleRef      `json:"roleRef,omitzero"`
	Subjects []Subject    `json:"subjects,omitempty"`
}

// PolicyRule mirrors rbacv1.PolicyRule.
type PolicyRule struct {
	Verbs           []string `json:"verbs"`
	APIGroups       []string `json:"apiGroups,omitempty"`
	Resources       []string `json:"resources,omitempty"`
	ResourceNames   []string `json:"resourceNames,omitempty"`
	NonResourceURLs []string `json:"nonResourceURLs,omitempty"`
}

// RoleRef mirrors rbacv1.RoleRef. Kind is "Role" or "ClusterRole".
type RoleRef struct {
	APIGroup string `json:"apiGroup,omitempty"`
	Kind     string `json:"kind"`
	Name     string `json:"name"`
}

// Subject mirrors rbacv1.Subject. Kind is "User", "Group" or
// "ServiceAccount".
type Subject struct {
	Kind      string `json:"kind"`
	APIGroup  string `json:"apiGroup,omitempty"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

// Role is a stored Role (Namespace set) or ClusterRole (Namespace empty).
// Values returned by the index are shared and must not be mutated.
type Role struct {
	Cluster   string
	Namespace string
	Name      string
	Rules     []PolicyRule
}

// Binding is a stored RoleBinding (Namespace set) or ClusterRoleBinding
// (Namespace empty). Values returned by the index are shared and must not be
// mutated.
type Binding struct {
	Cluster   string
	Namespace string
	Name      string
	RoleRef   RoleRef
	Subjects  []Subject
}
