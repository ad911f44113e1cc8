kvlab_lab(01 01-why-slow WRONG forgets_classifier naive_attends_once)
