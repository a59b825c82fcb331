package ingestserver

// NoResponderWindow is noResponderWindow, for the package's external
// tests.
const NoResponderWindow = noResponderWindow
