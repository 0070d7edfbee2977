// Keeps k3_stages a real library while stages/ is being filled in.
