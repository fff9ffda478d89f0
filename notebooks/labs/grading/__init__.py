"""The lab grader (``python notebooks/labs/grade.py LAB [FILE]``), split into small modules:

* ``core``: the command line, the cases (visible and hidden), the points, the report and results.json;
* ``child``: the child process that runs the student's TODO parts inside the grader's own given code;
* ``hints``: what to say about a failing case (English and Chinese, ``i18n``);
* ``given_lab1/2/4``: the grader's own copies of the code the labs give.
"""
